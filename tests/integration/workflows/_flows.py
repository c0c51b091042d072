"""Workflow types for the workflow tests, in a module with a table where steps record their effects.

Run as a script, it is one worker process: ``python _flows.py URL SCHEMA INSTANCE LEASE_TTL`` composes a control
plane with this module and runs the ``controllers`` role until SIGTERM.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import attrs

from bettercompute import Job, RetryPolicy, Step, StepContext, StepOutcome, Workflow
from bettercompute.errors import UnavailableError
from bettercompute.ports import Migration, Transaction
from bettercompute.testing import OutsideCallProbe
from bettercompute_store_pg import Statement, connection_of, fetch_in

_TABLES = """
CREATE TABLE {schema}.wf_effects (
    id bigserial PRIMARY KEY,
    workflow text NOT NULL,
    step text NOT NULL,
    worker text NOT NULL,
    UNIQUE (workflow, step)
);
CREATE TABLE {schema}.wf_compensations (
    id bigserial PRIMARY KEY,
    workflow text NOT NULL,
    step text NOT NULL
);
CREATE TABLE {schema}.wf_markers (
    workflow text PRIMARY KEY,
    worker text NOT NULL,
    pid integer NOT NULL
);
"""

STEP_DEADLINE = dt.timedelta(seconds=4)
"""The steps of ``crashy`` (short, so a killed worker's claim runs out soon: deadline + margin + lease TTL)."""


async def _execute(ctx: StepContext, tx: Transaction, sql: str, params: Mapping[str, Any]) -> None:
    """Run ``sql`` in ``tx``, one of the step's writes blocks (``{s}`` is the schema)."""
    schema = getattr(ctx.store, "schema")  # noqa: B009 - PgStore's, not on the port
    await fetch_in(connection_of(tx), Statement.of(sql.replace("{s}", f'"{schema}"')), params)


async def record_effect(ctx: StepContext, tx: Transaction, step: str | None = None) -> None:
    """Record an effect of this step in ``tx``; the unique (workflow, step) makes a second one fail loudly."""
    await _execute(
        ctx,
        tx,
        "INSERT INTO {s}.wf_effects (workflow, step, worker) VALUES (:w, :step, :worker)",
        {"w": ctx.workflow_id, "step": step or ctx.step, "worker": ctx.context.instance},
    )


async def effect(ctx: StepContext) -> None:
    """Record this step's effect in a writes block of its own."""
    async with ctx.writes() as tx:
        await record_effect(ctx, tx)


async def compensation(ctx: StepContext) -> None:
    async with ctx.writes() as tx:
        await _execute(
            ctx,
            tx,
            "INSERT INTO {s}.wf_compensations (workflow, step) VALUES (:w, :step)",
            {"w": ctx.workflow_id, "step": ctx.step},
        )


async def _first(ctx: StepContext) -> StepOutcome:
    await effect(ctx)
    return StepOutcome.next(data={"first": 1})


async def _second(ctx: StepContext) -> StepOutcome:
    await effect(ctx)
    return StepOutcome.next(data={"second": ctx.data["first"] + 1})


async def _third(ctx: StepContext) -> StepOutcome:
    await effect(ctx)
    return StepOutcome.next(data={"third": ctx.data["second"] + 1, "seen": sorted(ctx.data)})


THREE = Workflow(
    name="three", steps=(Step(name="one", run=_first), Step(name="two", run=_second), Step(name="three", run=_third))
)


async def _always_unavailable(ctx: StepContext) -> StepOutcome:
    async with ctx.writes() as tx:
        await record_effect(ctx, tx)  # rolled back with the block the error leaves, so it never sticks
        raise UnavailableError("the database went away in the middle of the step's writes")


async def _give_up(ctx: StepContext) -> StepOutcome:
    return StepOutcome.fail("NO_DISKS", "the machine has no disks")


FLAKY = Workflow(
    name="flaky",
    steps=(
        Step(
            name="call",
            run=_always_unavailable,
            retry=RetryPolicy(base=dt.timedelta(seconds=10), max_attempts=3, jitter=0.0),
        ),
    ),
)
REFUSE = Workflow(name="refuse", steps=(Step(name="inspect", run=_give_up),))


async def _ask(ctx: StepContext) -> StepOutcome:
    await effect(ctx)
    return StepOutcome.wait(
        "approved", timeout=dt.timedelta(hours=1), on_timeout=ctx.data.get("on_timeout", "fail"), data={"asked": True}
    )


async def _finish(ctx: StepContext) -> StepOutcome:
    await effect(ctx)
    return StepOutcome.next(data={"approved_by": ctx.data.get("approved", {}).get("by")})


APPROVAL = Workflow(name="approval", steps=(Step(name="ask", run=_ask), Step(name="finish", run=_finish)))


async def _saga_wait(ctx: StepContext) -> StepOutcome:
    await effect(ctx)
    return StepOutcome.wait("never")


SAGA = Workflow(
    name="saga",
    steps=(
        Step(name="reserve", run=_first, compensate=compensation),
        Step(name="no-undo", run=_second),
        Step(name="configure", run=_saga_wait, compensate=compensation),
        Step(name="unreached", run=_third, compensate=compensation),
    ),
)


async def _crash_here(ctx: StepContext) -> StepOutcome:
    """Apply the effect in the block that records the outcome, then (the first time only) announce it and hang in
    the block until killed."""
    done = StepOutcome.next(data={"second": ctx.data["first"] + 1})
    async with ctx.writes(outcome=done) as tx:
        await record_effect(ctx, tx)
        store: Any = ctx.store  # PgStore: fetch runs outside the block's transaction, so the marker commits at once
        first = await store.fetch(
            store.sql(
                "INSERT INTO {s}.wf_markers (workflow, worker, pid) VALUES (:w, :worker, :pid) "
                "ON CONFLICT (workflow) DO NOTHING RETURNING workflow"
            ),
            {"w": ctx.workflow_id, "worker": ctx.context.instance, "pid": os.getpid()},
        )
        if first:
            await anyio.sleep(3600)  # cut short by kill -9 (or, on a machine too slow to kill us, by the deadline)
    return done


CRASHY = Workflow(
    name="crashy",
    steps=(
        Step(name="one", run=_first, deadline=STEP_DEADLINE),
        Step(name="two", run=_crash_here, deadline=STEP_DEADLINE),
        Step(name="three", run=_third, deadline=STEP_DEADLINE),
    ),
)

BMC = OutsideCallProbe()
"""The BMC of the ``power`` workflow: a test double that fails when called inside a transaction."""


async def _power_on(ctx: StepContext) -> StepOutcome:
    """Write, call the BMC, write again: the call happens between the step's writes blocks."""
    async with ctx.writes() as tx:
        await record_effect(ctx, tx, "asked")
    await BMC.call(ctx.idempotency_key)
    done = StepOutcome.next(data={"power": "on"})
    async with ctx.writes(outcome=done) as tx:  # the last writes and the step's outcome commit together
        await record_effect(ctx, tx, "on")
    return done


async def _finish_then(ctx: StepContext) -> StepOutcome:
    """Record the outcome with an effect, then do what ``ctx.data["then"]`` says."""
    then = ctx.data["then"]
    done = StepOutcome.next(data={"finished": True})
    async with ctx.writes(outcome=done) as tx:
        await record_effect(ctx, tx)
        if then == "raise inside":
            raise UnavailableError("the database went away before the block ended")
    if then == "raise after":
        raise RuntimeError("a failure once the outcome is recorded")
    if then == "write after":
        async with ctx.writes() as tx:
            await record_effect(ctx, tx, "late")
    return StepOutcome.fail("IGNORED")  # the recorded outcome stands


async def _nested(ctx: StepContext) -> StepOutcome:
    async with ctx.writes() as tx:
        await record_effect(ctx, tx)
        async with ctx.writes():
            pass
    return StepOutcome.next()


POWER = Workflow(name="power", steps=(Step(name="power-on", run=_power_on),))
FINISH = Workflow(name="finish", steps=(Step(name="finish", run=_finish_then, retry=RetryPolicy(max_attempts=1)),))
NESTED = Workflow(name="nested", steps=(Step(name="nest", run=_nested, retry=RetryPolicy(max_attempts=1)),))

ALL = (THREE, FLAKY, REFUSE, APPROVAL, SAGA, POWER, NESTED, FINISH)


@attrs.frozen(kw_only=True)
class FlowsModule:
    """No methods; a table of effects and some workflow types."""

    workflows: Sequence[Workflow] = ALL
    name: str = "flows"
    version: str = "0.1.0"
    core_range: str = ">=0.1"
    groups: Sequence[Any] = ()
    actions: Sequence[str] = ()
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(
        factory=lambda: {"postgresql": [Migration(version=1, name="effects", sql=_TABLES)]}
    )
    jobs: Sequence[Job] = ()

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
            modules=[FlowsModule(workflows=(CRASHY,))],
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
