"""Workflows through ``jobs.tick()`` on a manual clock: success, data, retries, failure, waits, signals, cancel."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import attrs
import pytest

from bettercompute import BetterCompute, Options, better_compute
from bettercompute.errors import NotFoundError
from bettercompute.testing import ManualClock
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

from ._flows import BMC, FlowsModule

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@attrs.frozen(kw_only=True)
class Plane:
    compute: BetterCompute
    store: PgStore
    clock: ManualClock

    async def settle(self, limit: int = 20) -> int:
        """Tick until a tick runs no workflow pass; how many passes ran."""
        total = 0
        for _ in range(limit):
            done = await self.compute.jobs.tick()
            if not done.get("reconcile:workflow"):
                return total
            total += done["reconcile:workflow"]
        raise AssertionError("the workflows never settled")

    async def effects(self, workflow: str) -> list[str]:
        rows = await self.store.fetch(
            self.store.sql("SELECT step FROM {s}.wf_effects WHERE workflow = :w ORDER BY id"), {"w": workflow}
        )
        return [row.step for row in rows]

    async def due(self) -> int:
        """Work items due now (by the manual clock)."""
        rows = await self.store.fetch(
            self.store.sql("SELECT count(*) AS n FROM {s}.work_queue WHERE run_at <= :now"), {"now": self.clock.now()}
        )
        return int(rows[0].n)


@pytest.fixture
async def plane(database_url: str, fresh_schema: str) -> AsyncIterator[Plane]:
    store = PgStore(database_url, schema=fresh_schema, pool_size=4)
    await store.open()
    clock = ManualClock((await store.now()).replace(microsecond=0) + dt.timedelta(seconds=1))
    compute = better_compute(
        Options(store=store, iam=EmbeddedIam(), modules=[FlowsModule()], clock=clock, instance="tick")
    )
    await compute.initialize()
    # A minute ahead of the database, so that work it stamps with its now (start, signal) is due even on a slow
    # machine; every delay the tests check counts from the manual clock.
    clock.set((await store.now()).replace(microsecond=0) + dt.timedelta(minutes=1))
    try:
        yield Plane(compute=compute, store=store, clock=clock)
    finally:
        await compute.close()


async def test_three_steps_run_to_success_passing_data(plane: Plane) -> None:
    workflows = plane.compute.workflows
    id = await workflows.start("three", tenant="t-1", subject="node/1", data={"given": "x"})
    started = await workflows.get(id)
    assert (started.state, started.step, started.step_index, started.attempt) == ("running", "one", 0, 1)
    await plane.settle()
    done = await workflows.get(id)
    assert done.state == "succeeded"
    assert done.reason is None
    assert (done.step, done.step_index, done.completed) == (None, 3, 3)
    assert done.data == {"given": "x", "first": 1, "second": 2, "third": 3, "seen": ["first", "given", "second"]}
    assert (done.tenant, done.subject, done.type) == ("t-1", "node/1", "three")
    assert await plane.effects(id) == ["one", "two", "three"]
    assert [(e.step, e.attempt, e.outcome) for e in await workflows.history(id)] == [
        ("one", 1, "next"),
        ("two", 1, "next"),
        ("three", 1, "next"),
    ]
    assert await plane.store.queue.pending() == 0


async def test_start_in_commits_with_the_callers_transaction(plane: Plane) -> None:
    workflows = plane.compute.workflows
    with pytest.raises(RuntimeError):
        async with plane.store.transaction() as tx:
            lost = await workflows.start_in(tx, "three", tenant="t-1")
            raise RuntimeError("the caller's change fails")
    with pytest.raises(NotFoundError):
        await workflows.get(lost)
    assert await plane.store.queue.pending() == 0
    with pytest.raises(NotFoundError):
        await workflows.start("no-such-type", tenant="t-1")


async def test_a_failing_step_retries_with_backoff_then_fails_with_its_reason(plane: Plane) -> None:
    workflows = plane.compute.workflows
    id = await workflows.start("flaky", tenant="t-1")
    await plane.settle()
    retrying = await workflows.get(id)
    assert (retrying.state, retrying.step, retrying.attempt, retrying.reason) == ("running", "call", 2, "UNAVAILABLE")
    assert await plane.due() == 0  # backing off: nothing runs until the delay has passed
    plane.clock.advance(dt.timedelta(seconds=9))
    assert await plane.settle() == 0
    plane.clock.advance(dt.timedelta(seconds=2))  # 10 s after the first failure
    assert await plane.settle() == 1
    assert (await workflows.get(id)).attempt == 3
    plane.clock.advance(dt.timedelta(seconds=19))  # the second delay is twice the first
    assert await plane.settle() == 0
    plane.clock.advance(dt.timedelta(seconds=2))
    assert await plane.settle() == 1
    failed = await workflows.get(id)
    assert (failed.state, failed.step, failed.attempt, failed.reason) == ("failed", "call", 3, "UNAVAILABLE")
    assert "call" in failed.message
    assert [(e.attempt, e.outcome, e.reason) for e in await workflows.history(id)] == [
        (1, "error", "UNAVAILABLE"),
        (2, "error", "UNAVAILABLE"),
        (3, "error", "UNAVAILABLE"),
    ]
    assert await plane.effects(id) == []  # each failed attempt's writes rolled back
    assert await plane.store.queue.pending() == 0


async def test_a_step_may_fail_the_workflow_with_a_reason(plane: Plane) -> None:
    id = await plane.compute.workflows.start("refuse", tenant="t-1")
    await plane.settle()
    failed = await plane.compute.workflows.get(id)
    assert (failed.state, failed.step, failed.reason, failed.message) == (
        "failed",
        "inspect",
        "NO_DISKS",
        "the machine has no disks",
    )


async def test_a_wait_parks_without_work_until_signalled(plane: Plane) -> None:
    workflows = plane.compute.workflows
    id = await workflows.start("approval", tenant="t-1")
    await plane.settle()
    parked = await workflows.get(id)
    assert (parked.state, parked.step, parked.waiting_for) == ("waiting", "ask", "approved")
    assert parked.wake_at == plane.clock.now() + dt.timedelta(hours=1)
    assert parked.data == {"asked": True}
    assert await plane.due() == 0  # parked: no work item is due (only the timeout's, an hour away)
    plane.clock.advance(dt.timedelta(minutes=30))
    assert await plane.settle() == 0

    assert await workflows.signal(id, "approved", {"by": "alice"})
    await plane.settle()
    done = await workflows.get(id)
    assert done.state == "succeeded"
    assert done.data == {"asked": True, "approved": {"by": "alice"}, "approved_by": "alice"}
    assert await plane.effects(id) == ["ask", "finish"]  # the step that waited ran once
    assert [e.outcome for e in await workflows.history(id)] == ["wait", "signaled", "next"]
    assert not await workflows.signal(id, "approved", {"by": "bob"})  # it has ended


async def test_a_signal_before_the_wait_is_kept(plane: Plane) -> None:
    workflows = plane.compute.workflows
    id = await workflows.start("approval", tenant="t-1")
    assert await workflows.signal(id, "approved", {"by": "early"})
    await plane.settle()
    done = await workflows.get(id)
    assert (done.state, done.data["approved_by"]) == ("succeeded", "early")


async def test_a_wait_timeout_fails_or_goes_on_as_declared(plane: Plane) -> None:
    workflows = plane.compute.workflows
    failing = await workflows.start("approval", tenant="t-1")
    going_on = await workflows.start("approval", tenant="t-1", data={"on_timeout": "next"})
    await plane.settle()
    plane.clock.advance(dt.timedelta(hours=1, seconds=1))
    await plane.settle()
    failed = await workflows.get(failing)
    assert (failed.state, failed.step, failed.reason) == ("failed", "ask", "WAIT_TIMEOUT")
    went_on = await workflows.get(going_on)
    assert went_on.state == "succeeded"
    assert "approved" not in went_on.data
    assert [e.outcome for e in await workflows.history(going_on)] == ["wait", "timed_out", "next"]


async def test_cancel_runs_the_completed_steps_compensations_in_reverse(plane: Plane) -> None:
    workflows = plane.compute.workflows
    id = await workflows.start("saga", tenant="t-1")
    await plane.settle()
    assert (await workflows.get(id)).state == "waiting"
    assert await workflows.cancel(id, "OPERATOR_ABORT", "no longer needed")
    cancelling = await workflows.get(id)
    assert (cancelling.state, cancelling.reason) == ("cancelling", "OPERATOR_ABORT")
    assert not await workflows.signal(id, "never")
    await plane.settle()
    cancelled = await workflows.get(id)
    assert (cancelled.state, cancelled.reason, cancelled.message) == ("cancelled", "OPERATOR_ABORT", "no longer needed")
    assert cancelled.completed == 0
    rows = await plane.store.fetch(
        plane.store.sql("SELECT step FROM {s}.wf_compensations WHERE workflow = :w ORDER BY id"), {"w": id}
    )
    # configure (the step that waited had acted) then reserve; no-undo declares none; unreached never ran.
    assert [row.step for row in rows] == ["configure", "reserve"]
    assert [(e.step, e.outcome) for e in await workflows.history(id)][-3:] == [
        ("configure", "compensated"),
        ("no-undo", "no_compensation"),
        ("reserve", "compensated"),
    ]
    assert not await workflows.cancel(id)


async def test_a_step_calls_outside_between_its_writes_blocks_each_committed(plane: Plane) -> None:
    workflows = plane.compute.workflows
    id = await workflows.start("power", tenant="t-1", subject="node/3")
    await plane.settle()
    done = await workflows.get(id)
    assert (done.state, done.data) == ("succeeded", {"power": "on"})
    # The BMC double raises when called inside a transaction: the step reached it with no writes block open.
    assert [call for call in BMC.calls if call.startswith(id)] == [f"{id}/power-on/1"]
    assert await plane.effects(id) == ["asked", "on"]
    assert [(e.step, e.attempt, e.outcome) for e in await workflows.history(id)] == [("power-on", 1, "next")]


async def test_writes_blocks_do_not_nest_and_the_outer_one_rolls_back(plane: Plane) -> None:
    workflows = plane.compute.workflows
    id = await workflows.start("nested", tenant="t-1")
    await plane.settle()
    failed = await workflows.get(id)
    assert (failed.state, failed.reason) == ("failed", "EXCEPTION:RuntimeError")
    assert await plane.effects(id) == []


async def test_a_block_carrying_the_outcome_commits_it_with_its_writes_or_neither(plane: Plane) -> None:
    workflows = plane.compute.workflows
    ids = {
        then: await workflows.start("finish", tenant="t-1", data={"then": then})
        for then in ("return", "raise after", "write after", "raise inside")
    }
    await plane.settle()
    for then in ("return", "raise after", "write after"):
        id = ids[then]
        done = await workflows.get(id)
        # Recorded with the block: what the step did or returned after it changes nothing, and no block follows it.
        assert (done.state, done.data, done.reason) == ("succeeded", {"then": then, "finished": True}, None), then
        assert await plane.effects(id) == ["finish"], then
        assert [(e.step, e.attempt, e.outcome) for e in await workflows.history(id)] == [("finish", 1, "next")], then
    failed = await workflows.get(ids["raise inside"])
    assert (failed.state, failed.step, failed.reason) == ("failed", "finish", "UNAVAILABLE")
    assert await plane.effects(ids["raise inside"]) == []  # neither the writes nor the outcome
    assert [(e.outcome, e.reason) for e in await workflows.history(ids["raise inside"])] == [("error", "UNAVAILABLE")]
