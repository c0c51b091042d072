"""The lease metrics of a worker process: what it holds (shard and singleton leases), what it took, and what it lost
when another holder took a lease over under it (here by rewriting the lease rows, as an expiry and a takeover by a
second worker would)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import anyio
import psycopg
import pytest

from bettercompute import BetterCompute, Options, Outcome, ReconcileContext, Reconciler, better_compute
from bettercompute._runtime.shards import SHARDS
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests._timing import deadline

from ._probe import ProbeModule

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def _value(compute: BetterCompute, name: str, kind: str) -> float:
    return compute.metrics.registry.get_sample_value(name, {"kind": kind}) or 0.0


async def _until(check: Callable[[], bool], seconds: float = 20) -> None:
    with anyio.fail_after(deadline(seconds)):
        while not check():  # noqa: ASYNC110 - metrics give no event to wait on
            await anyio.sleep(0.1)


async def test_leases_held_taken_and_lost_are_counted(database_url: str, fresh_schema: str) -> None:
    async def done(ctx: ReconcileContext, key: str) -> Outcome:
        return Outcome.done()

    module = ProbeModule(reconcilers=(Reconciler(kind="probe", reconcile=done),))
    compute = better_compute(
        Options(
            store=PgStore(database_url, schema=fresh_schema, pool_size=4),
            iam=EmbeddedIam(),
            modules=[module],
            lease_ttl=dt.timedelta(seconds=3),
            poll_interval=dt.timedelta(seconds=0.2),
        )
    )
    await compute.start({"controllers"})
    try:
        await _until(lambda: _value(compute, "bettercompute_leases_held", "shard") == SHARDS)
        await _until(lambda: _value(compute, "bettercompute_leases_held", "singleton") >= 1)
        singletons = _value(compute, "bettercompute_leases_held", "singleton")
        assert _value(compute, "bettercompute_leases_acquired_total", "shard") == SHARDS
        assert _value(compute, "bettercompute_leases_acquired_total", "singleton") == singletons
        assert _value(compute, "bettercompute_leases_lost_total", "shard") == 0
        assert _value(compute, "bettercompute_leases_lost_total", "singleton") == 0
        # The worker samples the queue's depth of its kinds as it starts (nothing due here).
        assert compute.metrics.registry.get_sample_value("bettercompute_queue_depth", {"kind": "probe"}) == 0

        # Another holder takes every lease over, with a later expiry than this worker would renew to.
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                f"UPDATE \"{fresh_schema}\".leases SET holder = 'thief', token = token + 1, "
                "expires_at = now() + interval '1 hour'"
            )
        await _until(lambda: _value(compute, "bettercompute_leases_lost_total", "shard") == SHARDS)
        await _until(lambda: _value(compute, "bettercompute_leases_lost_total", "singleton") == singletons)
        assert _value(compute, "bettercompute_leases_held", "shard") == 0
        assert _value(compute, "bettercompute_leases_held", "singleton") == 0
    finally:
        await compute.close()
    assert _value(compute, "bettercompute_leases_held", "shard") == 0
