"""Webhooks end to end: committed events reach a real HTTP receiver, signed, in per-key order, at least once."""

from __future__ import annotations

import base64
import json
import logging
from collections import defaultdict

import anyio
import psycopg
import pytest
import standardwebhooks

from bettercompute import BetterCompute
from bettercompute.modules.webhooks import (
    EVENT_ID_HEADER,
    EVENT_TYPE_HEADER,
    Delivery,
    ListDeliveriesInput,
    WebhookTestInput,
    verify,
)
from tests._timing import deadline

from .conftest import FAST, Hooks, Received, Receiver

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def _events(receiver: Receiver) -> list[dict[str, object]]:
    return [json.loads(r.body) for r in receiver.received]


async def test_every_event_arrives_signed_and_in_order_per_key(hooks: Hooks, receiver: Receiver) -> None:
    _, secret = await hooks.subscribe(receiver.url)
    keys = [f"res_{k}" for k in range(4)]
    for n in range(5):
        for key in keys:
            await hooks.publish("reservation.updated", key, n=n)
    await hooks.pump(lambda: len({json.loads(r.body)["id"] for r in receiver.received}) >= 20)

    per_key: dict[str, list[int]] = defaultdict(list)
    seen_ids: set[str] = set()
    for item in receiver.received:
        verify(secret, item.headers, item.body)
        event = json.loads(item.body)
        assert item.headers[EVENT_ID_HEADER.lower()] == event["id"]
        assert item.headers[EVENT_TYPE_HEADER.lower()] == "reservation.updated"
        assert event["tenant"] == hooks.acme
        if event["id"] not in seen_ids:  # at least once: the receiver drops duplicates by event id
            seen_ids.add(event["id"])
            per_key[event["key"]].append(event["data"]["n"])
    assert len(seen_ids) == 20
    assert {key: per_key[key] for key in keys} == {key: [0, 1, 2, 3, 4] for key in keys}


async def test_a_receiver_down_for_a_while_gets_its_backlog(hooks: Hooks, receiver: Receiver) -> None:
    webhook_id, secret = await hooks.subscribe(receiver.url)
    await receiver.stop()
    for n in range(3):
        await hooks.publish("node.changed", "node_1", n=n)
    # While it is down, the first event of the key is tried and the others wait behind it, untried.
    for _ in range(3):  # the outbox hands out one event of a key per pass
        await hooks.compute.jobs.tick({"sinks"})
    log = await hooks.api.deliveries(hooks.alice, ListDeliveriesInput(tenant=hooks.acme, id=webhook_id))
    assert [d.status for d in log.deliveries] == ["pending"] * 3
    first = log.deliveries[-1]
    assert 1 <= first.attempts < FAST.max_attempts
    assert first.last_error is not None and "ConnectError" in first.last_error
    assert all(d.attempts == 0 for d in log.deliveries[:-1])

    await receiver.start()  # same port
    await hooks.pump(lambda: len(receiver.received) >= 3)
    for item in receiver.received:
        verify(secret, item.headers, item.body)
    assert [e["data"]["n"] for e in _events(receiver)] == [0, 1, 2]  # type: ignore[index]
    log = await hooks.api.deliveries(hooks.alice, ListDeliveriesInput(tenant=hooks.acme, id=webhook_id))
    assert [d.status for d in log.deliveries] == ["delivered"] * 3
    assert log.deliveries[-1].last_status == 200
    # Each delivery's lag, from its event's commit, for the metrics: the first waited out the receiver's outage.
    registry = hooks.compute.metrics.registry
    assert registry.get_sample_value("bettercompute_webhook_delivery_lag_seconds_count") == 3
    assert registry.get_sample_value("bettercompute_webhook_dead_letters_total") == 0


async def test_a_receiver_that_always_fails_ends_dead_and_shows_in_the_log(hooks: Hooks, receiver: Receiver) -> None:
    receiver.status = 500
    webhook_id, _ = await hooks.subscribe(receiver.url)
    await hooks.publish("reservation.created", "res_9")
    await hooks.publish("reservation.created", "res_9", second=True)

    async def statuses() -> list[str]:
        log = await hooks.api.deliveries(hooks.alice, ListDeliveriesInput(tenant=hooks.acme, id=webhook_id))
        return [d.status for d in log.deliveries]

    state: list[str] = []

    def done() -> bool:
        return state == ["dead", "dead"]

    with anyio.fail_after(deadline(30)):
        while not done():
            await hooks.compute.jobs.tick({"sinks"})
            state = await statuses()
            await anyio.sleep(0.05)
    log = await hooks.api.deliveries(hooks.alice, ListDeliveriesInput(tenant=hooks.acme, id=webhook_id))
    for delivery in log.deliveries:
        assert delivery.attempts == FAST.max_attempts
        assert delivery.last_status == 500
        assert delivery.last_error == "the receiver answered HTTP 500"
        assert delivery.finished_at is not None and delivery.next_attempt_at is None
    assert receiver.received == []
    assert hooks.compute.metrics.registry.get_sample_value("bettercompute_webhook_dead_letters_total") == 2
    text = json.dumps([str(d) for d in log.deliveries])
    assert "whsec_" not in text


async def test_event_type_filters_select_what_is_sent(hooks: Hooks, receiver: Receiver) -> None:
    await hooks.subscribe(receiver.url, "reservation.*", "node.adopted")
    await hooks.publish("reservation.created", "a")
    await hooks.publish("node.adopted", "b")
    await hooks.publish("node.lost", "c")
    await hooks.publish("reservations.created", "d")  # not under 'reservation.'
    await hooks.publish("reservation.created", "e", tenant=hooks.globex)  # another tenant's event
    await hooks.pump(lambda: len(receiver.received) >= 2)
    for _ in range(5):  # give any wrongly queued delivery its chance to arrive
        await hooks.compute.jobs.tick({"sinks"})
    assert sorted(e["key"] for e in _events(receiver)) == ["a", "b"]  # type: ignore[type-var]


async def test_webhooks_test_delivers_to_that_subscription_only(hooks: Hooks, receiver: Receiver) -> None:
    webhook_id, secret = await hooks.subscribe(receiver.url)
    other = Receiver()
    await other.start()
    try:
        await hooks.subscribe(other.url)
        sent = await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=webhook_id))
        await hooks.pump(lambda: len(receiver.received) >= 1)
        for _ in range(3):
            await hooks.compute.jobs.tick({"sinks"})
        assert other.received == []
    finally:
        await other.stop()
    (item,) = receiver.received
    verify(secret, item.headers, item.body)
    event = json.loads(item.body)
    assert event["type"] == "webhook.test" and event["id"] == sent.event_id
    assert item.headers[EVENT_ID_HEADER.lower()] == sent.event_id


async def test_no_table_holds_a_plain_secret(hooks: Hooks, receiver: Receiver, database_url: str) -> None:
    _, secret = await hooks.subscribe(receiver.url)
    await hooks.publish("reservation.created", "a")
    await hooks.pump(lambda: len(receiver.received) >= 1)
    token = secret.removeprefix("whsec_")
    schema = hooks.store.schema
    with psycopg.connect(database_url) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
            )
        ]
        assert "webhook_subscriptions" in tables and "audit" in tables
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{schema}"."{table}"'):
                for value in row:
                    raw = bytes(value) if isinstance(value, bytes | memoryview) else str(value).encode()
                    assert token.encode() not in raw, table


async def _only_delivery(hooks: Hooks, webhook_id: str) -> Delivery:
    log = await hooks.api.deliveries(hooks.alice, ListDeliveriesInput(tenant=hooks.acme, id=webhook_id))
    deliveries: tuple[Delivery, ...] = log.deliveries
    (delivery,) = deliveries
    return delivery


async def test_a_sender_without_the_key_spends_no_attempt_and_never_dead_letters(
    hooks: Hooks, keyless: BetterCompute, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    webhook_id, secret = await hooks.subscribe(receiver.url)
    receiver.status = 500
    await hooks.publish("node.changed", "node_1")
    await hooks.pump(lambda: receiver.connections >= 1)  # one real attempt, by a worker with the key: it counts
    assert (await _only_delivery(hooks, webhook_id)).attempts == 1

    def refusals() -> int:
        return sum("cannot open the secret" in record.getMessage() for record in caplog.records)

    # A worker whose key file holds another key claims the delivery again and again, many times max_attempts.
    with caplog.at_level(logging.ERROR, logger="bettercompute.webhooks"), anyio.fail_after(deadline(30)):
        while refusals() < 3 * FAST.max_attempts:
            await keyless.jobs.tick({"sinks"})
            if (await _only_delivery(hooks, webhook_id)).status != "pending":
                break
            await anyio.sleep(0.02)
    held = await _only_delivery(hooks, webhook_id)
    assert held.status == "pending" and held.attempts == 1
    assert held.last_error == "the signing secret cannot be decrypted by this worker"
    assert held.finished_at is None and held.next_attempt_at is not None
    assert receiver.connections == 1  # nothing was sent unsigned
    assert "whsec_" not in caplog.text and secret.removeprefix("whsec_") not in caplog.text

    # A worker with the key delivers it; only real attempts were counted.
    receiver.status = 200
    await hooks.pump(lambda: len(receiver.received) >= 1)
    (item,) = receiver.received
    verify(secret, item.headers, item.body)
    done = await _only_delivery(hooks, webhook_id)
    assert done.status == "delivered" and done.attempts == 2 and done.last_error is None


async def test_a_standard_webhooks_receiver_verifies_real_deliveries(hooks: Hooks, receiver: Receiver) -> None:
    _, secret = await hooks.subscribe(receiver.url)
    # The secret is in the specification's form: whsec_ and the standard base64 of 32 random bytes.
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:], validate=True)) == 32
    await hooks.publish("reservation.placed", "rsv_1", n=1)
    await hooks.pump(lambda: len(receiver.received) >= 1)
    item = receiver.received[0]
    receiving = standardwebhooks.Webhook(secret)
    event = receiving.verify(item.body, item.headers)
    assert event["type"] == "reservation.placed" and event["data"]["n"] == 1
    assert item.headers["webhook-id"] == event["id"] == item.headers[EVENT_ID_HEADER.lower()]
    verify(secret, item.headers, item.body)  # the earlier headers are there too, for receivers written against them
    verify(secret, {k: v for k, v in item.headers.items() if not k.startswith("webhook-")}, item.body)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        receiving.verify(item.body.replace(b'"n":1', b'"n":2'), item.headers)
    stale = {**item.headers, "webhook-timestamp": str(int(item.headers["webhook-timestamp"]) - 3600)}
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        receiving.verify(item.body, stale)


async def test_a_rotated_secret_signs_next_to_the_new_one_for_the_overlap_only(
    hooks: Hooks, receiver: Receiver, database_url: str
) -> None:
    from bettercompute.errors import NotFoundError
    from bettercompute.modules.webhooks import RotateWebhookSecretInput

    webhook_id, old = await hooks.subscribe(receiver.url)
    rotated = await hooks.api.rotate_secret(hooks.alice, RotateWebhookSecretInput(tenant=hooks.acme, id=webhook_id))
    new = rotated.secret
    assert new != old and rotated.webhook.id == webhook_id

    async def deliver(n: int) -> Received:
        await hooks.publish("reservation.placed", "rsv_1", n=n)
        await hooks.pump(lambda: any(json.loads(r.body)["data"].get("n") == n for r in receiver.received))
        return next(r for r in receiver.received if json.loads(r.body)["data"].get("n") == n)

    # During the overlap both secrets sign: a receiver still on the old one and one already on the new one accept.
    during = await deliver(1)
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    legacy = {k: v for k, v in during.headers.items() if not k.startswith("webhook-")}
    for secret in (old, new):
        standardwebhooks.Webhook(secret).verify(during.body, during.headers)
        verify(secret, during.headers, during.body)
        verify(secret, legacy, during.body)  # the earlier header carries both signatures too
    # Once the overlap is over (moved into the past here), only the new one signs.
    with psycopg.connect(database_url) as conn:
        conn.execute(
            f"UPDATE \"{hooks.store.schema}\".webhook_subscriptions SET previous_until = now() - interval '1 second'"
            " WHERE id = %s",
            (webhook_id,),
        )
    after = await deliver(2)
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    standardwebhooks.Webhook(new).verify(after.body, after.headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(old).verify(after.body, after.headers)
    # Without an overlap the replaced secret stops signing at once.
    newest = await hooks.api.rotate_secret(
        hooks.alice, RotateWebhookSecretInput(tenant=hooks.acme, id=webhook_id, overlap_seconds=0)
    )
    last = await deliver(3)
    standardwebhooks.Webhook(newest.secret).verify(last.body, last.headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(new).verify(last.body, last.headers)
    with pytest.raises(NotFoundError):
        await hooks.api.rotate_secret(hooks.alice, RotateWebhookSecretInput(tenant=hooks.acme, id="wh_nope"))
    # Bad overlaps are refused at their path, and the secret is left as it was.
    for bad in (-1, 7 * 24 * 3600 + 1, 1.5, True, "60", "\uff16\uff10", None):
        answer = await hooks.http.post(
            "/api/compute/webhooks/rotate-secret",
            headers={"authorization": f"Bearer {hooks.alice}"},
            json={"tenant": hooks.acme, "id": webhook_id, "overlap_seconds": bad},
        )
        assert answer.status_code == 400, (bad, answer.text)
        error = answer.json()["error"]
        assert error["code"] == "INVALID_INPUT" and error["details"]["path"] == "overlap_seconds", (bad, error)
    unchanged = await deliver(4)
    standardwebhooks.Webhook(newest.secret).verify(unchanged.body, unchanged.headers)
