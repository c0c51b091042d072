"""A module with one reconciler that records when each pass on a key ran, for the worker tests.

Run as a script, it is one worker process: ``python _probe.py URL SCHEMA INSTANCE LEASE_TTL`` composes a control plane
with this module and runs the ``controllers`` role until SIGTERM.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import attrs

from bettercompute import Job, Outcome, ReconcileContext, Reconciler
from bettercompute.ports import Migration
from bettercompute_store_pg import Statement, connection_of, fetch_in

KIND = "probe"
PASS_SECONDS = 0.15

_RUNS = """
CREATE TABLE {schema}.probe_runs (
    id bigserial PRIMARY KEY,
    key text NOT NULL,
    worker text NOT NULL,
    started double precision NOT NULL,
    ended double precision NOT NULL
);
"""


async def probe(ctx: ReconcileContext, key: str) -> Outcome:
    """Take a little while, then record the pass in a transaction fenced by the shard lease."""
    started = time.time()
    await anyio.sleep(PASS_SECONDS)
    async with ctx.transaction() as tx:
        schema = getattr(ctx.store, "schema")  # noqa: B009 - PgStore's, not on the port
        await fetch_in(
            connection_of(tx),
            Statement.of(
                f'INSERT INTO "{schema}".probe_runs (key, worker, started, ended) '
                "VALUES (:key, :worker, :started, :ended)"
            ),
            {"key": key, "worker": ctx.context.instance, "started": started, "ended": time.time()},
        )
    return Outcome.done()


RECONCILER = Reconciler(kind=KIND, reconcile=probe, deadline=dt.timedelta(seconds=5))


@attrs.frozen(kw_only=True)
class ProbeModule:
    """The module: no methods, one table, one reconciler."""

    name: str = "probe"
    version: str = "0.1.0"
    core_range: str = ">=0.1"
    groups: Sequence[Any] = ()
    actions: Sequence[str] = ()
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(
        factory=lambda: {"postgresql": [Migration(version=1, name="probe runs", sql=_RUNS)]}
    )
    jobs: Sequence[Job] = ()
    reconcilers: Sequence[Reconciler] = (RECONCILER,)

    async def start(self, context: Any) -> None:
        return None

    async def stop(self) -> None:
        return None


async def _main(url: str, schema: str, instance: str, ttl: float) -> None:
    import signal

    from bettercompute import Options, better_compute
    from bettercompute_iam import EmbeddedIam
    from bettercompute_store_pg import PgStore

    store = PgStore(url, schema=schema, pool_size=4)
    compute = better_compute(
        Options(
            store=store,
            iam=EmbeddedIam(),
            modules=[ProbeModule()],
            instance=instance,
            lease_ttl=dt.timedelta(seconds=ttl),
            poll_interval=dt.timedelta(seconds=0.3),
        )
    )
    try:
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                await tg.start(compute.run, {"controllers"})
                print("ready", flush=True)
                async for _ in signals:
                    break
                tg.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await compute.close()


if __name__ == "__main__":
    anyio.run(_main, sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
