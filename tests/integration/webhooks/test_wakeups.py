"""The ``sinks`` loops (events dispatcher, webhook sender) as a worker runs them: a notifier poke sends a committed
event at once, and without pokes (no notifier, or a poke that never came) they still deliver by polling."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

from bettercompute import Events
from bettercompute.modules.webhooks import WEBHOOKS, WebhookTestInput, verify
from bettercompute_store_pg import PgNotifier, PgStore
from tests._timing import deadline

from .conftest import Receiver, open_hooks

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def _until(condition: Callable[[], bool], within: float) -> None:
    with anyio.fail_after(deadline(within)):
        while not condition():  # noqa: ASYNC110 - polling state another task changes, with a deadline
            await anyio.sleep(0.05)


def _keys(receiver: Receiver) -> list[str]:
    return [json.loads(r.body)["key"] for r in receiver.received]


@pytest.fixture
async def notifier(database_url: str, fresh_schema: str) -> AsyncIterator[PgNotifier]:
    async with PgNotifier(database_url, schema=fresh_schema) as notifier:
        yield notifier


async def test_a_poke_sends_an_event_long_before_the_poll_would(
    database_url: str, fresh_schema: str, tmp_path: Path, receiver: Receiver, notifier: PgNotifier
) -> None:
    poll = dt.timedelta(seconds=60)
    async with open_hooks(
        database_url, fresh_schema, tmp_path / "kms.key", notifier=notifier, poll_interval=poll
    ) as hooks:
        webhook_id, secret = await hooks.subscribe(receiver.url)
        await hooks.compute.start({"sinks"})
        await hooks.publish("node.changed", "node_1")
        await _until(lambda: len(receiver.received) >= 1, 10)
        await anyio.sleep(2)  # both loops have made their passes and now wait for the minute-long poll

        await hooks.publish("node.changed", "node_2")
        await _until(lambda: len(receiver.received) >= 2, 10)  # only pokes can have brought it this soon

        sent = await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=webhook_id))
        await _until(lambda: len(receiver.received) >= 3, 10)
    assert _keys(receiver)[:2] == ["node_1", "node_2"]
    assert json.loads(receiver.received[2].body)["id"] == sent.event_id
    for item in receiver.received:
        verify(secret, item.headers, item.body)


class _SlowToListen:
    """A real ``PgNotifier`` whose LISTEN takes a second to be in place, as on a busy or distant server."""

    def __init__(self, inner: PgNotifier) -> None:
        self._inner = inner

    async def notify(self, channel: str, payload: str = "") -> None:
        await self._inner.notify(channel, payload)

    @contextlib.asynccontextmanager
    async def listen(self, channel: str) -> AsyncIterator[AsyncIterator[str]]:
        await anyio.sleep(1)
        async with self._inner.listen(channel) as pokes:
            yield pokes


async def test_an_event_published_as_soon_as_the_loops_start_is_not_left_for_the_poll(
    database_url: str, fresh_schema: str, tmp_path: Path, receiver: Receiver, notifier: PgNotifier
) -> None:
    """``start`` returns once the loops listen: the poke of a publish right after it is heard, not lost to a LISTEN
    still on its way (which would leave the event for the minute-long poll)."""
    poll = dt.timedelta(seconds=60)
    async with open_hooks(
        database_url, fresh_schema, tmp_path / "kms.key", notifier=_SlowToListen(notifier), poll_interval=poll
    ) as hooks:
        await hooks.subscribe(receiver.url)
        await hooks.compute.start({"sinks"})
        await hooks.publish("node.changed", "node_1")
        await _until(lambda: len(receiver.received) >= 1, 10)
    assert _keys(receiver) == ["node_1"]


async def test_the_sinks_loops_deliver_by_polling_with_the_notifier_off(
    database_url: str, fresh_schema: str, tmp_path: Path, receiver: Receiver
) -> None:
    poll = dt.timedelta(milliseconds=300)
    async with open_hooks(database_url, fresh_schema, tmp_path / "kms.key", poll_interval=poll) as hooks:
        webhook_id, _ = await hooks.subscribe(receiver.url)
        await hooks.compute.start({"sinks"})
        for n in range(3):
            for key in ("res_a", "res_b"):
                await hooks.publish("reservation.updated", key, n=n)
        await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=webhook_id))
        await _until(lambda: len({json.loads(r.body)["id"] for r in receiver.received}) >= 7, 30)
    events = [json.loads(r.body) for r in receiver.received]
    for key in ("res_a", "res_b"):
        order = [e["data"]["n"] for e in events if e["key"] == key]
        assert sorted(set(order)) == [0, 1, 2] and order == sorted(order)


async def test_an_event_whose_poke_never_came_is_sent_at_the_next_poll(
    database_url: str, fresh_schema: str, tmp_path: Path, receiver: Receiver, notifier: PgNotifier
) -> None:
    poll = dt.timedelta(seconds=1)
    async with open_hooks(
        database_url, fresh_schema, tmp_path / "kms.key", notifier=notifier, poll_interval=poll
    ) as hooks:
        await hooks.subscribe(receiver.url)
        await hooks.compute.start({"sinks"})
        await anyio.sleep(1)
        # Published through a bare store with no control plane around it: nothing pokes after this commit.
        async with PgStore(database_url, schema=fresh_schema, pool_size=1) as bare, bare.transaction() as tx:
            await tx.publish([Events.event("node.changed", "node_1", tenant=hooks.acme)])
        await _until(lambda: len(receiver.received) >= 1, 20)
    assert _keys(receiver) == ["node_1"]


async def test_the_sender_sends_a_key_backlog_without_waiting_for_its_polls(
    database_url: str, fresh_schema: str, tmp_path: Path, receiver: Receiver
) -> None:
    """Only the head of a key's deliveries can be claimed; a pass that delivered some is followed by another at
    once, so the next of the key does not wait a poll (here a minute) for its turn."""
    poll = dt.timedelta(seconds=60)
    async with open_hooks(database_url, fresh_schema, tmp_path / "kms.key", poll_interval=poll) as hooks:
        webhook_id, _ = await hooks.subscribe(receiver.url)
        async with hooks.store.transaction() as tx:
            for n in range(3):
                added = await tx.repository(WEBHOOKS).add_delivery(
                    tenant=hooks.acme,
                    id=webhook_id,
                    event_id=f"evt_{n}",
                    event_type="node.changed",
                    event_key="node_1",
                    body=json.dumps({"key": "node_1", "n": n}),
                )
                assert added
        await hooks.compute.start({"sinks"})
        await _until(lambda: len(receiver.received) >= 3, 15)
    assert [json.loads(r.body)["n"] for r in receiver.received] == [0, 1, 2]
