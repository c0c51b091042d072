"""stop() in the middle of a reconcile hands the item back at once, so the next worker need not wait for its claim
to run out (a rolling deploy would otherwise stall those keys)."""

from __future__ import annotations

import datetime as dt

import anyio
import psycopg
import pytest

from bettercompute import Options, Outcome, ReconcileContext, Reconciler, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests._timing import deadline

from ._probe import ProbeModule

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_stop_hands_an_in_flight_item_back(database_url: str, fresh_schema: str) -> None:
    started = anyio.Event()

    async def slow(ctx: ReconcileContext, key: str) -> Outcome:
        started.set()
        await anyio.sleep(60)
        return Outcome.done()

    module = ProbeModule(reconcilers=(Reconciler(kind="slow", reconcile=slow, deadline=dt.timedelta(minutes=2)),))
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
        reconciler = module.reconcilers[0]
        async with compute.context.store.transaction() as tx:
            await tx.enqueue([reconciler.item("k1")])
        with anyio.fail_after(deadline(20)):
            await started.wait()
        await compute.stop()
        with psycopg.connect(database_url) as conn:
            row = conn.execute(
                f'SELECT state, last_error, run_at <= now() FROM "{fresh_schema}".work_queue WHERE key = %s', ("k1",)
            ).fetchone()
        # Ready again now, not claimed for the two minutes its deadline allows.
        assert row == ("ready", "WORKER_STOPPED", True)
    finally:
        await compute.close()
