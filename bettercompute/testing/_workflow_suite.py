"""``WorkflowStoreConformance``: what the workflow engine (``bettercompute.Workflows``) needs of the workflow store
(``tx.repository(WORKFLOWS)`` in a transaction, ``store.repository(WORKFLOWS)`` outside one).

``StoreConformance`` includes these cases; subclass this class alone, with the same ``store`` fixture, to run only
them. The engine writes a workflow's progress and its log entry in one transaction (with whatever else it holds),
writes a workflow only under ``lock``, parks a waiting workflow as a work item due at its timeout (the store has no
query of due workflows: the work queue is it), and shows the step log oldest first; each case below is one of those
reliances.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio
import attrs
import pytest

from bettercompute._runtime.workflows import WORKFLOW_KIND as KIND
from bettercompute.errors import ConflictError, FailedPreconditionError, InternalError
from bettercompute.ports import WORKFLOWS, OutboxEvent, Store, Transaction, WorkflowRecord, WorkItem

__all__ = ["WorkflowStoreConformance"]

DATA: dict[str, Any] = {"node": "n-1", "tries": [1, 2], "nested": {"ok": True, "none": None}, "ratio": 0.5, "name": "ü"}
"""Workflow data with every JSON type, nested."""
SHORT = dt.timedelta(milliseconds=300)
PAST_SHORT = 0.6
LONG = dt.timedelta(minutes=5)


class _Failed(Exception):
    """Raised inside a transaction to roll it back."""


def _started(id: str = "wf-1", **changes: Any) -> WorkflowRecord:
    """A workflow as ``Workflows.start_in`` inserts it: running, at its first step's first attempt."""
    record = WorkflowRecord(
        id=id,
        type="conformance.probe",
        tenant="t-1",
        subject="node/n-1",
        state="running",
        step_index=0,
        step="first",
        attempt=1,
        data=DATA,
    )
    return attrs.evolve(record, **changes)


def _mutable(record: WorkflowRecord) -> dict[str, Any]:
    """The fields ``update`` writes."""
    fixed = {"id", "type", "tenant", "subject", "created_at", "updated_at"}
    return {k: v for k, v in attrs.asdict(record, recurse=False).items() if k not in fixed}


@pytest.mark.anyio
class WorkflowStoreConformance:
    """The ``WorkflowStore`` contract, through the ``Store`` protocol only."""

    async def _insert(self, store: Store, record: WorkflowRecord) -> WorkflowRecord:
        async with store.transaction() as tx:
            await tx.repository(WORKFLOWS).insert(record)
        stored = await store.repository(WORKFLOWS).get(record.id)
        assert stored is not None
        return stored

    async def _update(self, store: Store, record: WorkflowRecord) -> WorkflowRecord:
        async with store.transaction() as tx:
            locked = await tx.repository(WORKFLOWS).lock(record.id)
            assert locked is not None
            await tx.repository(WORKFLOWS).update(record)
        stored = await store.repository(WORKFLOWS).get(record.id)
        assert stored is not None
        return stored

    async def _log(self, store: Store, id: str, *lines: tuple[int, str, int, str, str | None]) -> None:
        async with store.transaction() as tx:
            for step_index, step, attempt, outcome, reason in lines:
                await tx.repository(WORKFLOWS).log(
                    workflow_id=id,
                    step_index=step_index,
                    step=step,
                    attempt=attempt,
                    outcome=outcome,
                    reason=reason,
                )

    # --- create and read --------------------------------------------------------------------------------------

    async def test_workflow_insert_then_get_with_the_stores_timestamps(self, store: Store) -> None:
        before = await store.now()
        stored = await self._insert(store, _started())
        after = await store.now()
        assert attrs.evolve(stored, created_at=None, updated_at=None) == _started()
        assert stored.data == DATA
        assert (stored.completed, stored.compensating, stored.reason, stored.message) == (0, False, None, "")
        assert (stored.inbox, stored.waiting_for, stored.on_timeout, stored.wake_at) == ({}, None, None, None)
        assert stored.created_at is not None and stored.updated_at is not None
        assert stored.created_at.utcoffset() == dt.timedelta(0)
        assert before <= stored.created_at <= after
        assert before <= stored.updated_at <= after

    async def test_an_unknown_workflow_is_none(self, store: Store) -> None:
        assert await store.repository(WORKFLOWS).get("wf-missing") is None
        async with store.transaction() as tx:
            assert await tx.repository(WORKFLOWS).lock("wf-missing") is None
        assert await store.repository(WORKFLOWS).history("wf-missing") == []

    async def test_workflow_insert_with_a_taken_id_is_a_conflict_and_keeps_the_first(self, store: Store) -> None:
        first = await self._insert(store, _started())
        with pytest.raises(ConflictError):
            async with store.transaction() as tx:
                await tx.repository(WORKFLOWS).insert(_started(type="other", tenant="t-2", data={"other": 1}))
        assert await store.repository(WORKFLOWS).get("wf-1") == first

    async def test_writes_and_locks_outside_a_transaction_are_refused(self, store: Store) -> None:
        stored = await self._insert(store, _started())
        workflows = store.repository(WORKFLOWS)
        with pytest.raises(InternalError, match="needs a transaction"):
            await workflows.insert(_started("wf-2"))
        with pytest.raises(InternalError, match="needs a transaction"):
            await workflows.lock("wf-1")
        with pytest.raises(InternalError, match="needs a transaction"):
            await workflows.update(attrs.evolve(stored, state="failed"))
        with pytest.raises(InternalError, match="needs a transaction"):
            await workflows.log(workflow_id="wf-1", step_index=0, step="first", attempt=1, outcome="next", reason=None)
        assert await workflows.get("wf-2") is None and await workflows.get("wf-1") == stored
        assert await workflows.history("wf-1") == []

    # --- progress commits or rolls back with the caller's transaction ----------------------------------------

    async def test_a_started_workflow_and_its_work_exist_only_once_the_transaction_commits(self, store: Store) -> None:
        with pytest.raises(_Failed):
            async with store.transaction() as tx:
                await tx.repository(WORKFLOWS).insert(_started("wf-dropped"))
                await tx.enqueue([WorkItem(kind=KIND, key="wf-dropped")])
                raise _Failed
        assert await store.repository(WORKFLOWS).get("wf-dropped") is None
        assert await store.queue.pending([KIND]) == 0

        async with store.transaction() as tx:
            await tx.repository(WORKFLOWS).insert(_started("wf-kept"))
            await tx.enqueue([WorkItem(kind=KIND, key="wf-kept")])
            assert (
                await store.repository(WORKFLOWS).get("wf-kept") is None
            )  # not outside the transaction before it commits
        assert await store.repository(WORKFLOWS).get("wf-kept") is not None
        claims = await store.queue.claim(kinds=[KIND], holder="worker-a", limit=10, claim_for=LONG)
        assert [claim.key for claim in claims] == ["wf-kept"]

    async def test_a_steps_writes_and_the_workflows_progress_commit_or_roll_back_together(self, store: Store) -> None:
        start = await self._insert(store, _started())
        advanced = attrs.evolve(start, step_index=1, step="second", completed=1, data={**DATA, "first": "done"})

        with pytest.raises(_Failed):
            async with store.transaction() as tx:
                await tx.publish([OutboxEvent(type="probe.stepped", key="wf-1")])  # the step's own write
                assert await tx.repository(WORKFLOWS).lock("wf-1") == start
                await tx.repository(WORKFLOWS).update(advanced)
                await self._log_in(store, tx, "wf-1", 0, "first", 1, "next")
                raise _Failed  # a crash before the commit
        assert await store.repository(WORKFLOWS).get("wf-1") == start
        assert await store.repository(WORKFLOWS).history("wf-1") == []
        assert await store.outbox.claim(holder="sink", limit=10, claim_for=LONG) == []

        async with store.transaction() as tx:
            await tx.publish([OutboxEvent(type="probe.stepped", key="wf-1")])
            assert await tx.repository(WORKFLOWS).lock("wf-1") == start
            await tx.repository(WORKFLOWS).update(advanced)
            await self._log_in(store, tx, "wf-1", 0, "first", 1, "next")
        stored = await store.repository(WORKFLOWS).get("wf-1")
        assert stored is not None
        assert _mutable(stored) == _mutable(advanced)
        assert [(e.step, e.outcome) for e in await store.repository(WORKFLOWS).history("wf-1")] == [("first", "next")]
        assert [e.type for e in await store.outbox.claim(holder="sink", limit=10, claim_for=LONG)] == ["probe.stepped"]

    async def _log_in(
        self, store: Store, tx: Transaction, id: str, index: int, step: str, attempt: int, outcome: str
    ) -> None:
        await tx.repository(WORKFLOWS).log(
            workflow_id=id, step_index=index, step=step, attempt=attempt, outcome=outcome, reason=None
        )

    async def test_workflow_progress_under_a_lost_lease_is_refused(self, store: Store) -> None:
        start = await self._insert(store, _started())
        old = await store.leases.acquire("controllers/shard:0", "worker-a", SHORT)
        assert old is not None
        await anyio.sleep(PAST_SHORT)
        assert await store.leases.acquire("controllers/shard:0", "worker-b", LONG) is not None
        with pytest.raises(FailedPreconditionError):
            async with store.transaction(fence=old) as tx:
                assert await tx.repository(WORKFLOWS).lock("wf-1") is not None
                await tx.repository(WORKFLOWS).update(attrs.evolve(start, state="failed", reason="STALE"))
                await self._log_in(store, tx, "wf-1", 0, "first", 1, "failed")
        assert await store.repository(WORKFLOWS).get("wf-1") == start
        assert await store.repository(WORKFLOWS).history("wf-1") == []

    async def test_update_writes_the_mutable_fields_only_and_stamps_updated_at(self, store: Store) -> None:
        start = await self._insert(store, _started())
        before = await store.now()
        changed = attrs.evolve(
            start,
            # Fixed at insert: an update leaves these as they were.
            type="renamed",
            tenant="t-other",
            subject="node/other",
            created_at=before + dt.timedelta(days=1),
            # Mutable.
            step_index=2,
            step="third",
            attempt=4,
            completed=2,
            reason="RETRY",
            message="attempt 3 of step 'third' failed (RETRY)",
            data={"replaced": [1, {"x": None}]},
        )
        stored = await self._update(store, changed)
        after = await store.now()
        assert (stored.type, stored.tenant, stored.subject, stored.created_at) == (
            start.type,
            start.tenant,
            start.subject,
            start.created_at,
        )
        assert _mutable(stored) == _mutable(changed)
        assert stored.updated_at is not None
        assert before <= stored.updated_at <= after

    # --- waits and signals ------------------------------------------------------------------------------------

    async def test_a_parked_workflow_keeps_its_wait_and_is_not_due_before_its_timeout(self, store: Store) -> None:
        start = await self._insert(store, _started())
        # Microseconds kept: the engine compares wake_at with the clock to tell a timeout.
        wake_at = (await store.now()).replace(microsecond=123456) + dt.timedelta(hours=1)
        waiting = attrs.evolve(
            start,
            state="waiting",
            completed=1,
            waiting_for="bmc.power_on",
            on_timeout="next",
            wake_at=wake_at,
            inbox={"early.reply": {"ok": True}},
        )
        async with store.transaction() as tx:
            assert await tx.repository(WORKFLOWS).lock("wf-1") is not None
            await tx.repository(WORKFLOWS).update(waiting)
            await tx.enqueue([WorkItem(kind=KIND, key="wf-1", run_at=wake_at)])
        stored = await store.repository(WORKFLOWS).get("wf-1")
        assert stored is not None
        assert _mutable(stored) == _mutable(waiting)
        assert stored.wake_at == wake_at
        assert stored.wake_at is not None and stored.wake_at.utcoffset() == dt.timedelta(0)
        assert await store.queue.claim(kinds=[KIND], holder="worker-a", limit=10, claim_for=LONG) == []
        assert await store.queue.pending([KIND]) == 1

    async def test_a_signal_then_the_wake_clear_the_wait(self, store: Store) -> None:
        start = await self._insert(store, _started())
        waiting = await self._update(
            store,
            attrs.evolve(
                start,
                state="waiting",
                completed=1,
                waiting_for="bmc.power_on",
                on_timeout="fail",
                wake_at=(await store.now()) + dt.timedelta(hours=1),
            ),
        )
        # Workflows.signal: the payload goes into the inbox, and the workflow is due now.
        async with store.transaction() as tx:
            locked = await tx.repository(WORKFLOWS).lock("wf-1")
            assert locked == waiting
            signalled = attrs.evolve(locked, inbox={**locked.inbox, "bmc.power_on": {"watts": 350}})
            await tx.repository(WORKFLOWS).update(signalled)
            await tx.enqueue([WorkItem(kind=KIND, key="wf-1")])
        [claim] = await store.queue.claim(kinds=[KIND], holder="worker-a", limit=10, claim_for=LONG)
        assert claim.key == "wf-1"
        stored = await store.repository(WORKFLOWS).get("wf-1")
        assert stored is not None and stored.inbox == {"bmc.power_on": {"watts": 350}}

        # The engine's wake: the event leaves the inbox for the data, and the wait is cleared (None written back).
        woken = attrs.evolve(
            stored,
            state="running",
            step_index=1,
            step="second",
            inbox={},
            data={**stored.data, "bmc.power_on": {"watts": 350}},
            waiting_for=None,
            on_timeout=None,
            wake_at=None,
        )
        stored = await self._update(store, woken)
        assert _mutable(stored) == _mutable(woken)
        assert (stored.waiting_for, stored.on_timeout, stored.wake_at, stored.inbox) == (None, None, None, {})

    async def test_lock_holds_off_a_second_writer_until_the_first_commits(self, store: Store) -> None:
        # A signal and the engine both read-modify-write the row under lock: neither write may be lost.
        await self._insert(store, _started())
        first_locked = anyio.Event()
        second_waiting = anyio.Event()

        async def add(event: str, *, first: bool) -> None:
            if not first:
                await first_locked.wait()
            async with store.transaction() as tx:
                if not first:
                    second_waiting.set()
                record = await tx.repository(WORKFLOWS).lock("wf-1")
                assert record is not None
                if first:
                    first_locked.set()
                    await second_waiting.wait()
                    await anyio.sleep(0.3)  # the second writer is blocked in lock() meanwhile
                await tx.repository(WORKFLOWS).update(attrs.evolve(record, inbox={**record.inbox, event: {}}))

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: add("one", first=True))
                tg.start_soon(lambda: add("two", first=False))
        stored = await store.repository(WORKFLOWS).get("wf-1")
        assert stored is not None
        assert stored.inbox == {"one": {}, "two": {}}

    # --- cancellation -----------------------------------------------------------------------------------------

    async def test_cancellation_and_end_states_round_trip(self, store: Store) -> None:
        start = await self._insert(store, _started())
        # Workflows.cancel, then the engine compensating the last completed step backwards, then done.
        steps = [
            attrs.evolve(start, state="cancelling", completed=2, step_index=2, step="third", reason="CANCELLED"),
            attrs.evolve(
                start,
                state="cancelling",
                compensating=True,
                completed=2,
                step_index=1,
                step="second",
                attempt=2,
                reason="CANCELLED",
                message="compensating step 'second' failed on attempt 1 (TIMEOUT); retrying",
            ),
            attrs.evolve(start, state="cancelling", compensating=True, completed=1, step_index=0, reason="CANCELLED"),
            attrs.evolve(start, state="cancelled", compensating=False, completed=0, reason="CANCELLED"),
        ]
        for record in steps:
            assert _mutable(await self._update(store, record)) == _mutable(record)

        other = await self._insert(store, _started("wf-2"))
        for record in (
            attrs.evolve(other, state="failed", reason="WAIT_TIMEOUT", message="step 'first' waited in vain"),
            attrs.evolve(other, state="succeeded", step_index=3, step=None, completed=3, reason=None, message=""),
        ):
            assert _mutable(await self._update(store, record)) == _mutable(record)

    # --- the step log -----------------------------------------------------------------------------------------

    async def test_the_step_log_is_oldest_first_per_workflow(self, store: Store) -> None:
        await self._insert(store, _started("wf-1"))
        await self._insert(store, _started("wf-2"))
        before = await store.now()
        await self._log(
            store, "wf-1", (0, "first", 1, "error", "EXCEPTION:TimeoutError"), (0, "first", 2, "next", None)
        )
        await self._log(store, "wf-2", (0, "first", 1, "next", None))
        await self._log(store, "wf-1", (1, "second", 1, "wait", None), (1, "second", 1, "signaled", None))
        with pytest.raises(_Failed):
            async with store.transaction() as tx:
                await self._log_in(store, tx, "wf-1", 2, "third", 1, "next")
                raise _Failed
        after = await store.now()

        history = await store.repository(WORKFLOWS).history("wf-1")
        assert [(e.step_index, e.step, e.attempt, e.outcome, e.reason) for e in history] == [
            (0, "first", 1, "error", "EXCEPTION:TimeoutError"),
            (0, "first", 2, "next", None),
            (1, "second", 1, "wait", None),
            (1, "second", 1, "signaled", None),
        ]
        assert all(e.workflow_id == "wf-1" for e in history)
        assert [e.id for e in history] == sorted({e.id for e in history})
        assert all(before <= e.at <= after and e.at.utcoffset() == dt.timedelta(0) for e in history)
        assert [e.at for e in history] == sorted(e.at for e in history)
        assert [(e.workflow_id, e.outcome) for e in await store.repository(WORKFLOWS).history("wf-2")] == [
            ("wf-2", "next")
        ]

    async def test_the_step_log_limit_keeps_the_newest_lines_oldest_first(self, store: Store) -> None:
        await self._insert(store, _started())
        await self._log(store, "wf-1", *[(0, "first", attempt, "retry", f"R{attempt}") for attempt in range(1, 6)])
        assert [e.reason for e in await store.repository(WORKFLOWS).history("wf-1", limit=2)] == ["R4", "R5"]
        assert [e.reason for e in await store.repository(WORKFLOWS).history("wf-1", limit=1)] == ["R5"]
        assert [e.reason for e in await store.repository(WORKFLOWS).history("wf-1", limit=50)] == [
            "R1",
            "R2",
            "R3",
            "R4",
            "R5",
        ]
