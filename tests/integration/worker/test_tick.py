"""``jobs.tick()``: one deterministic pass; retries with backoff, give-up, requeue, and roles, on a manual clock."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pytest

from bettercompute import Job, Options, Outcome, ReconcileContext, Reconciler, RetryPolicy, better_compute
from bettercompute.errors import UnavailableError
from bettercompute.ports import Migration
from bettercompute.testing import ManualClock
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

from ..conftest import drop_schema, new_schema

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@attrs.define
class Scenario:
    """Reconcilers whose behaviour depends on the key, and a log of every pass."""

    log: list[tuple[str, str, int, str | None]] = attrs.field(factory=list)
    failures: list[tuple[str, str]] = attrs.field(factory=list)
    requeued: set[str] = attrs.field(factory=set)

    async def node(self, ctx: ReconcileContext, key: str) -> Outcome:
        self.log.append((ctx.kind, key, ctx.attempt, ctx.last_error))
        if key.startswith("flaky") and ctx.attempt < 3:
            raise UnavailableError("not yet")
        if key.startswith("bad"):
            raise ValueError("never")
        if key.startswith("again") and key not in self.requeued:
            self.requeued.add(key)
            return Outcome.requeue(dt.timedelta(minutes=1))
        return Outcome.done()

    async def failed(self, ctx: ReconcileContext, key: str, reason: str) -> None:
        self.failures.append((key, reason))

    async def pool(self, ctx: ReconcileContext, key: str) -> Outcome:
        self.log.append((ctx.kind, key, ctx.attempt, ctx.last_error))
        return Outcome.done()

    def reconcilers(self) -> tuple[Reconciler, ...]:
        retry = RetryPolicy(base=dt.timedelta(seconds=10), max_attempts=3)
        return (
            Reconciler(kind="node", reconcile=self.node, retry=retry, on_failure=self.failed),
            Reconciler(kind="pool", reconcile=self.pool, role="scheduler"),
        )


@attrs.frozen(kw_only=True)
class ScenarioModule:
    reconcilers: Sequence[Reconciler]
    name: str = "scenario"
    version: str = "0.1.0"
    core_range: str = ">=0.1"
    groups: Sequence[Any] = ()
    actions: Sequence[str] = ()
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(factory=dict)
    jobs: Sequence[Job] = ()

    async def start(self, context: Any) -> None:
        return None

    async def stop(self) -> None:
        return None


async def _play(url: str, start: dt.datetime) -> tuple[Scenario, list[dict[str, int]], list[tuple[Any, ...]]]:
    """Enqueue the same work on a fresh schema, tick through ten simulated minutes, return what happened."""
    schema = new_schema()
    scenario = Scenario()
    clock = ManualClock(start)
    store = PgStore(url, schema=schema, pool_size=2)
    compute = better_compute(
        Options(
            store=store,
            iam=EmbeddedIam(),
            modules=[ScenarioModule(reconcilers=scenario.reconcilers())],
            clock=clock,
            instance="tick",
        )
    )
    node, pool = scenario.reconcilers()
    try:
        await compute.initialize()
        async with store.transaction() as tx:
            keys = ["ok-2", "flaky-1", "bad-1", "again-1", "ok-1"]
            await tx.enqueue([node.item(key, run_at=start) for key in keys])
            await tx.enqueue([pool.item("p-1", run_at=start)])
        passes = [await compute.jobs.tick({"controllers"})]
        for _ in range(10):
            clock.advance(dt.timedelta(minutes=1))
            passes.append(await compute.jobs.tick())
        rows = await store.fetch(
            store.sql("SELECT kind, key, state, attempts, last_error, run_at FROM {s}.work_queue ORDER BY kind, key"),
            {},
        )
        return scenario, passes, [tuple(row) for row in rows]
    finally:
        await compute.close()
        drop_schema(url, schema)


async def test_tick_gives_the_same_result_twice_from_the_same_start(database_url: str) -> None:
    store = PgStore(database_url, schema=new_schema(), pool_size=1)
    await store.open()
    start = (await store.now()).replace(microsecond=0) + dt.timedelta(seconds=1)
    await store.close()

    first = await _play(database_url, start)
    second = await _play(database_url, start)
    assert first[0].log == second[0].log
    assert first[0].failures == second[0].failures
    assert first[1] == second[1]
    assert first[2] == second[2]

    scenario, passes, rows = first
    # The first tick ran only the controllers' reconcilers, in (kind, key) order, each key once.
    assert [key for kind, key, _, _ in scenario.log[:5]] == ["again-1", "bad-1", "flaky-1", "ok-1", "ok-2"]
    # No scheduler reconciler, no job of another role; the controllers' singletons found nothing to do.
    assert passes[0] == {
        "reconcile:node": 5,
        "reconcile:desired-acked": 0,
        "reconcile:reservation": 0,
        "reconcile:inventory": 0,
        "reconcile:node-lifecycle": 0,
        "controllers/command-sweeper": 0,
        "controllers/session-sweeper": 0,
        "controllers/kms-rewrap": 0,
        "controllers/nonce-purge": 0,
        "controllers/signer-renewal": 0,
        "controllers/tunnel-sweep": 0,
        "controllers/usage": 0,
        "controllers/bookings-history": 0,
        "controllers/idempotency-purge": 0,
        "controllers/reservation-drafts": 0,
        "controllers/audit-chain": 0,
    }
    assert ("pool", "p-1", 1, None) in scenario.log  # the scheduler's reconciler ran in a later, all-roles tick
    # flaky-1 failed twice with a machine-readable reason, then succeeded on its third attempt.
    assert [(a, e) for k, key, a, e in scenario.log if key == "flaky-1"] == [
        (1, None),
        (2, "UNAVAILABLE"),
        (3, "UNAVAILABLE"),
    ]
    # bad-1 gave up after three attempts and the failure was recorded with its reason.
    assert scenario.failures == [("bad-1", "EXCEPTION:ValueError")]
    # again-1 asked for another pass a minute later, as a fresh item.
    assert [(a, e) for k, key, a, e in scenario.log if key == "again-1"] == [(1, None), (1, None)]
    assert rows == []
