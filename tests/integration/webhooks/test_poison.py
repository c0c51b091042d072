"""One delivery's poison never fails the sender's pass, and one tenant's backlog never starves another tenant.

Whatever a single attempt raises is that delivery's failed attempt (recorded, counted, backed off) while the rest of
the pass is delivered; a URL stored before ``create`` checked it with the client's parser is failed the same way;
and a pass takes tenants (and a tenant's subscriptions) in turns, a bounded share each.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import attrs
import httpx
import psycopg
import pytest

from bettercompute.modules.webhooks import (
    CreateWebhookInput,
    Delivery,
    ListDeliveriesInput,
    WebhookTestInput,
)
from tests._timing import deadline

from .conftest import FAST, GUARDED, Hooks, Receiver, second_plane

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


class _Custom(Exception):
    pass


# What a transport might raise, from httpx's own non-HTTPError to plain bugs: none may escape the attempt.
RAISED: list[Callable[[], BaseException]] = [
    lambda: httpx.InvalidURL("Invalid IDNA hostname"),
    lambda: UnicodeError("label empty or too long"),
    lambda: UnicodeEncodeError("idna", "\uff11", 0, 1, "not allowed"),
    lambda: ValueError("bad"),
    lambda: KeyError("host"),
    lambda: TypeError("bad"),
    lambda: AttributeError("raw_host"),
    lambda: AssertionError("unreachable"),
    lambda: RuntimeError("bad"),
    lambda: ZeroDivisionError(),
    lambda: OSError(99, "Cannot assign requested address"),
    lambda: RecursionError(),
    lambda: ExceptionGroup("several", [ValueError("a"), KeyError("b")]),
    lambda: _Custom("a receiver-specific bug"),
]


class FaultyTransport(httpx.AsyncBaseTransport):
    """A fake transport (no real one fails on demand): raises ``make()`` for requests to ``/poison``, sends every
    other request through a real one."""

    def __init__(self, make: Callable[[], BaseException]) -> None:
        self._make = make
        self._real = httpx.AsyncHTTPTransport()
        self.closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/poison":
            raise self._make()
        return await self._real.handle_async_request(request)

    async def aclose(self) -> None:
        self.closed = True
        await self._real.aclose()


async def _log(hooks: Hooks, tenant_token: str, tenant: str, webhook_id: str) -> tuple[Delivery, ...]:
    found = await hooks.api.deliveries(tenant_token, ListDeliveriesInput(tenant=tenant, id=webhook_id, limit=200))
    deliveries: tuple[Delivery, ...] = found.deliveries
    return deliveries


async def _subscribe_globex(hooks: Hooks, url: str) -> str:
    created = await hooks.api.create(hooks.mallory, CreateWebhookInput(tenant=hooks.globex, url=url))
    webhook_id: str = created.webhook.id
    return webhook_id


@pytest.mark.parametrize("make", RAISED, ids=lambda make: type(make()).__name__)
async def test_whatever_one_attempt_raises_fails_that_delivery_only(
    hooks: Hooks, receiver: Receiver, database_url: str, make: Callable[[], BaseException]
) -> None:
    poison_id, _ = await hooks.subscribe(receiver.url.replace("/hook", "/poison"))
    good_id, _ = await hooks.subscribe(receiver.url)
    other_id = await _subscribe_globex(hooks, receiver.url)
    # The poisoned delivery is the oldest, so it is claimed and sent first in the pass.
    await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=poison_id))
    for _ in range(5):
        await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=good_id))
        await hooks.api.test(hooks.mallory, WebhookTestInput(tenant=hooks.globex, id=other_id))

    transport = FaultyTransport(make)
    async with second_plane(hooks, database_url, attrs.evolve(FAST, transport=transport), instance="sender") as compute:
        await compute.jobs.tick({"sinks"})  # one pass
        assert len(receiver.received) == 10  # every other delivery of the pass arrived
        (poisoned,) = await _log(hooks, hooks.alice, hooks.acme, poison_id)
        assert poisoned.status == "pending" and poisoned.attempts == 1
        assert poisoned.last_error == f"request failed: {type(make()).__name__}"
        assert poisoned.next_attempt_at is not None and poisoned.next_attempt_at > poisoned.created_at
        for webhook_id, token, tenant in ((good_id, hooks.alice, hooks.acme), (other_id, hooks.mallory, hooks.globex)):
            assert {d.status for d in await _log(hooks, token, tenant, webhook_id)} == {"delivered"}

        # Retried after its backoff, counted each time, it ends as a dead letter like any failing delivery.
        with anyio.fail_after(deadline(30)):
            while True:
                await compute.jobs.tick({"sinks"})
                (last,) = await _log(hooks, hooks.alice, hooks.acme, poison_id)
                if last.status != "pending":
                    break
                await anyio.sleep(0.05)
        assert last.status == "dead" and last.attempts == FAST.max_attempts

        # The settings' transport outlives each pass's client: a later delivery still goes through it.
        await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=good_id))
        await compute.jobs.tick({"sinks"})
        assert len(receiver.received) == 11
        assert not transport.closed  # its owner closes it
    await transport.aclose()


# URLs the client cannot read, as a row written before create checked them might hold.
UNREADABLE = [
    "http://\uff11\uff12\uff17.\uff10.\uff10.\uff11/hook",  # full-width digits
    "http://\u0661\u0662\u0667.0.0.1/hook",  # Arabic-Indic digits
    "http://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54/hook",  # full-width letters
    "http://hooks\u202e.example.com/hook",  # a bidirectional override
    "http://[::1/hook",
    "no scheme at all",
]


@pytest.mark.parametrize("guard", ["guarded", "private-allowed"])
@pytest.mark.parametrize("url", UNREADABLE)
async def test_a_stored_url_the_client_cannot_read_is_a_failed_attempt(
    hooks: Hooks, receiver: Receiver, database_url: str, url: str, guard: str
) -> None:
    bad_id, _ = await hooks.subscribe("https://hooks.example.com/in")
    good_id, _ = await hooks.subscribe(receiver.url)
    with psycopg.connect(database_url, autocommit=True) as conn:  # as a row from before the check was made
        conn.execute(f'UPDATE "{hooks.store.schema}".webhook_subscriptions SET url = %s WHERE id = %s', (url, bad_id))
    await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=bad_id))
    await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=good_id))

    # With the guard on, the good one's loopback receiver is refused as well: it is still a recorded attempt.
    settings = GUARDED if guard == "guarded" else FAST
    async with second_plane(hooks, database_url, settings, instance="sender") as compute:
        await compute.jobs.tick({"sinks"})
    (bad,) = await _log(hooks, hooks.alice, hooks.acme, bad_id)
    assert bad.status == "pending" and bad.attempts == 1
    assert bad.last_error == "the destination URL cannot be parsed"
    assert bad.next_attempt_at is not None
    (good,) = await _log(hooks, hooks.alice, hooks.acme, good_id)
    assert good.attempts == 1
    if guard == "guarded":
        assert good.last_error == "destination address not allowed"
    else:
        assert good.status == "delivered" and len(receiver.received) == 1


@pytest.mark.parametrize("victim", ["another tenant", "another webhook of the same tenant"])
async def test_a_large_failing_backlog_does_not_starve_others(hooks: Hooks, receiver: Receiver, victim: str) -> None:
    failing = Receiver()
    failing.status = 500
    await failing.start()
    try:
        noisy_id, _ = await hooks.subscribe(failing.url)
        for _ in range(200):
            await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=noisy_id))
        if victim == "another tenant":
            quiet_id = await _subscribe_globex(hooks, receiver.url)
            await hooks.api.test(hooks.mallory, WebhookTestInput(tenant=hooks.globex, id=quiet_id))
        else:
            quiet_id, _ = await hooks.subscribe(receiver.url)
            await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=quiet_id))

        passes = 0
        with anyio.fail_after(deadline(60)):
            while not receiver.received:
                await hooks.compute.jobs.tick({"sinks"})
                passes += 1
        assert passes == 1, f"the quiet webhook's delivery waited {passes} passes behind the failing backlog"
        # The failing backlog is worked on too, a bounded share per pass.
        attempted = [d for d in await _log(hooks, hooks.alice, hooks.acme, noisy_id) if d.attempts > 0]
        assert 1 <= len(attempted) <= FAST.max_per_tenant
        assert failing.connections == len(attempted)
    finally:
        await failing.stop()


async def test_a_pass_takes_at_most_the_configured_share_of_one_tenant(
    hooks: Hooks, receiver: Receiver, database_url: str
) -> None:
    first_id, _ = await hooks.subscribe(receiver.url)
    second_id, _ = await hooks.subscribe(receiver.url)
    for _ in range(10):
        for webhook_id in (first_id, second_id):
            await hooks.api.test(hooks.alice, WebhookTestInput(tenant=hooks.acme, id=webhook_id))
    settings = attrs.evolve(FAST, max_per_tenant=5, max_per_webhook=3)
    async with second_plane(hooks, database_url, settings, instance="sender") as compute:
        await compute.jobs.tick({"sinks"})
        first = [d for d in await _log(hooks, hooks.alice, hooks.acme, first_id) if d.status == "delivered"]
        second = [d for d in await _log(hooks, hooks.alice, hooks.acme, second_id) if d.status == "delivered"]
        # At most 3 of one webhook and 5 of the tenant; the two webhooks took turns.
        assert (len(first), len(second)) in ((3, 2), (2, 3))
        assert len(receiver.received) == 5
        with anyio.fail_after(deadline(30)):
            while len(receiver.received) < 20:
                await compute.jobs.tick({"sinks"})
