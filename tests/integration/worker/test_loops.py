"""The worker loops in one process: they converge by polling alone, and a notifier poke wakes them sooner."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from bettercompute import BetterCompute, Events, Options, Outcome, ReconcileContext, Reconciler, better_compute
from bettercompute._runtime.shards import SHARDS
from bettercompute.ports import StoredEvent
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgNotifier, PgStore
from tests._timing import deadline

from ._probe import ProbeModule

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def _compute(url: str, schema: str, *, notifier: PgNotifier | None, poll: float) -> tuple[BetterCompute, list[str]]:
    done: list[str] = []

    async def record(ctx: ReconcileContext, key: str) -> Outcome:
        done.append(key)
        return Outcome.done()

    module = ProbeModule(reconcilers=(Reconciler(kind="probe", reconcile=record),))
    compute = better_compute(
        Options(
            store=PgStore(url, schema=schema, pool_size=4),
            iam=EmbeddedIam(),
            modules=[module],
            notifier=notifier,
            instance="loops",
            lease_ttl=dt.timedelta(seconds=3),
            poll_interval=dt.timedelta(seconds=poll),
        )
    )
    return compute, done


async def _until(condition: Callable[[], bool], within: float) -> None:
    with anyio.fail_after(deadline(within)):
        while not condition():  # noqa: ASYNC110 - polling state another task changes, with a deadline
            await anyio.sleep(0.1)


async def test_loops_converge_with_the_notifier_off(database_url: str, fresh_schema: str) -> None:
    compute, done = _compute(database_url, fresh_schema, notifier=None, poll=0.5)
    await compute.start({"controllers"})
    try:
        worker = compute.jobs.worker
        assert worker is not None
        await _until(lambda: len(worker.held) == SHARDS, 15)  # the only member owns every shard
        [reconciler] = [r for r in compute.jobs.reconcilers if r.kind == "probe"]
        async with compute.context.store.transaction() as tx:
            await tx.enqueue([reconciler.item(f"k-{i}") for i in range(30)])
        await _until(lambda: len(set(done)) == 30, 20)
        # The last items are settled just after their reconcile returns: give the queue a moment to empty.
        with anyio.fail_after(deadline(10)):
            while await compute.context.store.queue.pending():  # noqa: ASYNC110 - polling the database
                await anyio.sleep(0.05)
    finally:
        await compute.close()


@pytest.fixture
async def notifier(database_url: str, fresh_schema: str) -> AsyncIterator[PgNotifier]:
    async with PgNotifier(database_url, schema=fresh_schema) as notifier:
        yield notifier


async def test_a_poke_wakes_an_idle_loop_long_before_its_poll(
    database_url: str, fresh_schema: str, notifier: PgNotifier
) -> None:
    compute, done = _compute(database_url, fresh_schema, notifier=notifier, poll=120)
    await compute.start({"controllers"})
    try:
        worker = compute.jobs.worker
        assert worker is not None
        await _until(lambda: len(worker.held) == SHARDS, 15)
        await anyio.sleep(1)  # the loop has looked once, found nothing, and sleeps for its two-minute poll
        [reconciler] = [r for r in compute.jobs.reconcilers if r.kind == "probe"]
        async with compute.context.store.transaction() as tx:
            await tx.enqueue([reconciler.item("poked")])
        await _until(lambda: "poked" in done, 30)  # only a poke can have woken it this soon
    finally:
        await compute.close()


async def test_the_events_dispatcher_drains_a_key_backlog_without_waiting_for_its_polls(
    database_url: str, fresh_schema: str
) -> None:
    """The outbox hands out one event of a key per pass; a pass that delivered some is followed by another at once,
    so a key's backlog does not go out one poll (here a minute) per event."""
    compute, _ = _compute(database_url, fresh_schema, notifier=None, poll=60)
    seen: list[object] = []

    async def record(event: StoredEvent) -> None:
        seen.append(event.payload["n"])

    compute.events.subscribe(record)
    await compute.initialize()
    try:
        async with compute.context.store.transaction() as tx:
            await tx.publish([Events.event("probe.changed", "one-key", n=n) for n in range(4)])
        await compute.start({"sinks"})
        await _until(lambda: len(seen) >= 4, 15)
        assert seen == [0, 1, 2, 3]
    finally:
        await compute.close()


async def test_a_stuck_item_holds_one_slot_not_the_others_turn(database_url: str, fresh_schema: str) -> None:
    # One tenant's item that hangs (a BMC that never answers) next to another's stream of work: the stream goes on
    # while the stuck item still runs, in the same loop.
    release = anyio.Event()
    done: list[str] = []

    async def record(ctx: ReconcileContext, key: str) -> Outcome:
        if key == "stuck":
            await release.wait()
        done.append(key)
        return Outcome.done()

    module = ProbeModule(reconcilers=(Reconciler(kind="probe", reconcile=record),))
    compute = better_compute(
        Options(
            store=PgStore(database_url, schema=fresh_schema, pool_size=4),
            iam=EmbeddedIam(),
            modules=[module],
            instance="stuck",
            lease_ttl=dt.timedelta(seconds=3),
            poll_interval=dt.timedelta(seconds=0.3),
        )
    )
    await compute.start({"controllers"})
    try:
        worker = compute.jobs.worker
        assert worker is not None
        await _until(lambda: len(worker.held) == SHARDS, 15)
        [reconciler] = [r for r in compute.jobs.reconcilers if r.kind == "probe"]
        async with compute.context.store.transaction() as tx:
            await tx.enqueue([reconciler.item("stuck")])
        await anyio.sleep(1)  # the stuck item is claimed, and runs
        async with compute.context.store.transaction() as tx:
            await tx.enqueue([reconciler.item(f"k-{i}") for i in range(40)])
        await _until(lambda: len(set(done)) == 40, 20)
        assert "stuck" not in done  # all forty went through while it was still running
        release.set()
        await _until(lambda: "stuck" in done, 10)
    finally:
        release.set()
        await compute.close()
