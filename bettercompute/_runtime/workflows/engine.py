"""The engine: ``compute.workflows`` starts, inspects, signals and cancels workflows, and one reconciler of kind
``workflow`` runs their steps."""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import attrs

from bettercompute._runtime.reconcile import Outcome, ReconcileContext, Reconciler, RetryPolicy, reason_of
from bettercompute._runtime.shards import SHARDS, shard_of
from bettercompute.errors import ComputeError, ConflictError, InvalidConfigError, InvalidInputError, NotFoundError
from bettercompute.ports import WORKFLOWS, Transaction, WorkflowLogEntry, WorkflowRecord, WorkflowStore, WorkItem

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

from bettercompute._runtime.workflows.context import COMMIT_MARGIN, StepContext, StepOutcome, checked_reason
from bettercompute._runtime.workflows.definitions import (
    ACTIVE,
    MAX_STEPS_PER_PASS,
    PASS_MARGIN,
    TERMINAL,
    WORKFLOW_KIND,
    Step,
    Workflow,
)

__all__ = ["Workflows"]

log = logging.getLogger("bettercompute.workflows")


def _has_workflows(store: object) -> bool:
    """Whether ``store`` ships the workflow store (``store.repository(WORKFLOWS)``)."""
    repository = getattr(store, "repository", None)
    if not callable(repository):
        return False
    try:
        repository(WORKFLOWS)
    except ComputeError:
        return False
    return True


def _item(id: str) -> WorkItem:
    # What the engine's reconciler (kind ``workflow``, the default shard function) would enqueue for ``id``.
    return WorkItem(kind=WORKFLOW_KIND, key=id, shard=shard_of(id) % SHARDS, payload={})


def start_in(
    tx: Transaction,
    workflow: Workflow,
    *,
    tenant: str,
    subject: str = "",
    data: Mapping[str, Any] | None = None,
    id: str | None = None,
) -> Awaitable[str]:
    """Start ``workflow`` in the caller's transaction (a module's handler starting its own workflow type, which
    ``better_compute()`` registered from the module's ``workflows``); returns its id. ``compute.workflows.start_in``
    does the same by type name.

    Raises:
        InvalidInputError: no tenant, or ``data`` is not a JSON object.
    """
    return _insert(tx, workflow, tenant=tenant, subject=subject, data=data, id=id)


async def _insert(
    tx: Transaction,
    workflow: Workflow,
    *,
    tenant: str,
    subject: str,
    data: Mapping[str, Any] | None,
    id: str | None,
) -> str:
    if not tenant:
        raise InvalidInputError("a workflow needs a tenant")
    id = id or f"wf-{uuid.uuid4().hex}"
    record = WorkflowRecord(
        id=id,
        type=workflow.name,
        tenant=tenant,
        subject=subject,
        state="running",
        step_index=0,
        step=workflow.steps[0].name,
        attempt=1,
        data=dict(data or {}),
    )
    await tx.repository(WORKFLOWS).insert(record)
    await tx.enqueue([_item(id)])
    return id


async def signal_in(tx: Transaction, id: str, event: str, payload: Mapping[str, Any] | None = None) -> bool:
    """``Workflows.signal`` in the caller's transaction: ``False`` when the workflow has ended or is being cancelled
    (or does not exist)."""
    if not event:
        raise InvalidInputError("a signal needs an event name")
    record = await tx.repository(WORKFLOWS).lock(id)
    if record is None or record.state not in ("running", "waiting"):
        return False
    await tx.repository(WORKFLOWS).update(attrs.evolve(record, inbox={**record.inbox, event: dict(payload or {})}))
    await tx.enqueue([_item(id)])
    return True


class Workflows:
    """``compute.workflows``: start, inspect, signal and cancel workflows; the engine behind them.

    Args:
        context: The control plane's parts.
        workflows: Every module's workflow types (names unique).
    """

    def __init__(self, context: ModuleContext, workflows: Sequence[Workflow]) -> None:
        problems: list[str] = []
        types: dict[str, Workflow] = {}
        untyped: Sequence[object] = workflows
        for workflow in untyped:
            if not isinstance(workflow, Workflow):
                problems.append(f"{type(workflow).__name__} is not a bettercompute.Workflow")
                continue
            if workflow.name in types:
                problems.append(f"workflow type {workflow.name!r} is declared twice")
            types[workflow.name] = workflow
        if types and not _has_workflows(context.store):
            problems.append(f"store: {type(context.store).__name__} lacks workflows")
        if problems:
            raise InvalidConfigError("the workflows are misdeclared", details={"problems": problems})
        self._context = context
        self._types = types
        longest = max((s.deadline for w in types.values() for s in w.steps), default=dt.timedelta(seconds=30))
        self.reconciler = Reconciler(
            kind=WORKFLOW_KIND,
            reconcile=self._reconcile,
            deadline=longest + PASS_MARGIN,
            # The engine's own failures (the database away, the shard moved) are retried for hours.
            retry=RetryPolicy(base=dt.timedelta(seconds=1), max_delay=dt.timedelta(minutes=5), max_attempts=60),
            on_failure=self._gave_up,
        )

    @property
    def types(self) -> list[str]:
        """The declared workflow types, by name."""
        return sorted(self._types)

    @property
    def _store(self) -> WorkflowStore:
        """The workflow store outside a transaction (reads); inside one, ``tx.repository(WORKFLOWS)``."""
        return self._context.store.repository(WORKFLOWS)

    # --- the API ------------------------------------------------------------------------------------------------

    async def start(self, type: str, *, tenant: str, subject: str = "", data: Mapping[str, Any] | None = None) -> str:
        """Start a workflow of ``type`` in its own transaction; returns its id."""
        async with self._context.store.transaction() as tx:
            return await self.start_in(tx, type, tenant=tenant, subject=subject, data=data)

    async def start_in(
        self,
        tx: Transaction,
        type: str,
        *,
        tenant: str,
        subject: str = "",
        data: Mapping[str, Any] | None = None,
    ) -> str:
        """Start a workflow in the caller's transaction (it exists, and runs, only if that commits); returns its id.

        Raises:
            NotFoundError: No workflow type of that name is declared.
            InvalidInputError: ``data`` is not a JSON object.
        """
        workflow = self._types.get(type)
        if workflow is None:
            raise NotFoundError(f"no workflow type {type!r}", details={"type": type, "types": self.types})
        return await _insert(tx, workflow, tenant=tenant, subject=subject, data=data, id=None)

    async def get(self, id: str) -> WorkflowRecord:
        """The workflow: state, current step, attempts, reason, data.

        Raises:
            NotFoundError: There is no such workflow.
        """
        record = await self._store.get(id)
        if record is None:
            raise NotFoundError("no such workflow", details={"id": id})
        return record

    async def history(self, id: str, *, limit: int = 1000) -> list[WorkflowLogEntry]:
        """The workflow's step log, oldest first: every attempt's outcome and reason."""
        return await self._store.history(id, limit=limit)

    async def signal(self, id: str, event: str, payload: Mapping[str, Any] | None = None) -> bool:
        """Deliver ``event`` to a workflow and wake it. ``False`` when it has ended or is being cancelled.

        A workflow not (yet) waiting for ``event`` keeps it until a step waits for it (a later signal of the same
        event replaces an unconsumed one), so a reply that arrives before its wait is not lost.

        Raises:
            NotFoundError: There is no such workflow.
        """
        if not event:
            raise InvalidInputError("a signal needs an event name")
        async with self._context.store.transaction() as tx:
            record = await tx.repository(WORKFLOWS).lock(id)
            if record is None:
                raise NotFoundError("no such workflow", details={"id": id})
            if record.state not in ("running", "waiting"):
                return False
            await tx.repository(WORKFLOWS).update(
                attrs.evolve(record, inbox={**record.inbox, event: dict(payload or {})})
            )
            await tx.enqueue([self.reconciler.item(id)])
        return True

    async def cancel(self, id: str, reason: str = "CANCELLED", message: str = "") -> bool:
        """Cancel a running, waiting or failed workflow: its completed steps' compensations run, in reverse order
        (state ``cancelling``, then ``cancelled``). A step running meanwhile finishes first (and is compensated if
        it completed). ``False`` when it has already succeeded, been cancelled or is being cancelled.

        Raises:
            NotFoundError: There is no such workflow.
        """
        checked_reason(reason)
        async with self._context.store.transaction() as tx:
            record = await tx.repository(WORKFLOWS).lock(id)
            if record is None:
                raise NotFoundError("no such workflow", details={"id": id})
            if record.state not in ("running", "waiting", "failed"):
                return False
            await tx.repository(WORKFLOWS).update(
                attrs.evolve(
                    record,
                    state="cancelling",
                    reason=reason,
                    message=message,
                    waiting_for=None,
                    on_timeout=None,
                    wake_at=None,
                ),
            )
            await tx.enqueue([self.reconciler.item(id)])
        return True

    # --- the engine ---------------------------------------------------------------------------------------------

    async def _gave_up(self, ctx: ReconcileContext, key: str, reason: str) -> None:
        async with ctx.transaction() as tx:
            record = await tx.repository(WORKFLOWS).lock(key)
            if record is not None and record.state in ACTIVE:
                await tx.repository(WORKFLOWS).update(
                    attrs.evolve(
                        record, state="failed", reason=reason, message="the workflow engine could not make progress"
                    ),
                )

    async def _reconcile(self, ctx: ReconcileContext, key: str) -> Outcome:
        started = time.monotonic()
        budget = self.reconciler.deadline.total_seconds()
        for n in range(MAX_STEPS_PER_PASS):
            record = await self._store.get(key)
            if record is None or record.state in TERMINAL:
                return Outcome.done()
            workflow = self._types.get(record.type)
            if workflow is None:  # declared by a module this process does not run (a rolling upgrade, say)
                log.warning("workflow %s has type %s, unknown here; trying later", key, record.type)
                return Outcome.requeue(dt.timedelta(minutes=1))
            # Go on in this pass only while the next step's deadline still fits in it.
            upcoming = workflow.steps[max(0, min(record.step_index, len(workflow.steps) - 1))].deadline
            if n and time.monotonic() - started + upcoming.total_seconds() + COMMIT_MARGIN > budget:
                return Outcome.requeue()
            if record.state == "waiting":
                outcome = await self._wake(ctx, workflow, record)
            elif record.state == "cancelling":
                outcome = await self._compensate(ctx, workflow, record)
            else:
                outcome = await self._run_step(ctx, workflow, record)
            if outcome is not None:
                return outcome
        return Outcome.requeue()

    def _advance(self, workflow: Workflow, record: WorkflowRecord, data: Mapping[str, Any]) -> WorkflowRecord:
        """``record`` past its current step (succeeded after the last one)."""
        index = record.step_index + 1
        common: dict[str, Any] = {
            "data": dict(data),
            "completed": max(record.completed, index),
            "attempt": 1,
            "waiting_for": None,
            "on_timeout": None,
            "wake_at": None,
            "reason": None,
            "message": "",
        }
        if index >= len(workflow.steps):
            return attrs.evolve(record, state="succeeded", step_index=index, step=None, **common)
        return attrs.evolve(record, state="running", step_index=index, step=workflow.steps[index].name, **common)

    async def _log(self, tx: Transaction, record: WorkflowRecord, outcome: str, reason: str | None = None) -> None:
        await tx.repository(WORKFLOWS).log(
            workflow_id=record.id,
            step_index=record.step_index,
            step=record.step or "",
            attempt=record.attempt,
            outcome=outcome,
            reason=reason,
        )

    async def _wake(self, ctx: ReconcileContext, workflow: Workflow, snapshot: WorkflowRecord) -> Outcome | None:
        """A parked workflow: go on if its event came or its wait timed out, else park again."""
        now = ctx.clock.now()
        async with ctx.transaction() as tx:
            record = await tx.repository(WORKFLOWS).lock(snapshot.id)
            if record is None or record.state != "waiting":
                return None
            event = record.waiting_for or ""
            if event in record.inbox:
                inbox = dict(record.inbox)
                payload = inbox.pop(event)
                await self._log(tx, record, "signaled")
                record = attrs.evolve(record, inbox=inbox)
                await tx.repository(WORKFLOWS).update(self._advance(workflow, record, {**record.data, event: payload}))
                return None
            if record.wake_at is not None and record.wake_at <= now:
                await self._log(tx, record, "timed_out", "WAIT_TIMEOUT")
                if record.on_timeout == "next":
                    await tx.repository(WORKFLOWS).update(self._advance(workflow, record, record.data))
                    return None
                await tx.repository(WORKFLOWS).update(
                    attrs.evolve(
                        record,
                        state="failed",
                        reason="WAIT_TIMEOUT",
                        message=f"step {record.step!r} waited for {event!r} in vain",
                        waiting_for=None,
                        wake_at=None,
                    ),
                )
                return Outcome.done()
        if record.wake_at is None:
            return Outcome.done()
        return Outcome.requeue(max(dt.timedelta(0), record.wake_at - now))

    async def _run_step(self, ctx: ReconcileContext, workflow: Workflow, record: WorkflowRecord) -> Outcome | None:
        step = workflow.steps[record.step_index]
        sctx = StepContext(
            context=ctx.context,
            record=record,
            step=step.name,
            step_index=record.step_index,
            attempt=record.attempt,
            lease=ctx.lease,
        )

        async def finish(tx: Transaction, result: StepOutcome) -> Outcome | None:
            current = await tx.repository(WORKFLOWS).lock(record.id)
            if (
                current is None
                or current.state not in ("running", "cancelling")
                or current.compensating
                or (current.step_index, current.attempt) != (record.step_index, record.attempt)
            ):
                raise ConflictError("the workflow moved on while its step ran", details={"id": record.id})
            return await self._record(tx, workflow, current, result, ctx.clock.now())

        sctx._finish = finish
        try:
            with anyio.fail_after(step.deadline.total_seconds()):
                result = await step.run(sctx)
            if sctx._finished is None and not isinstance(result, StepOutcome):
                raise TypeError(f"step {step.name!r} returned {type(result).__name__}, not a StepOutcome")
        except Exception as exc:
            if sctx._finished is not None:  # committed with its last block: what failed after it changes nothing
                log.warning(
                    "workflow %s: step %s failed after recording its outcome (%s)", record.id, step.name, reason_of(exc)
                )
                return sctx._finished[0]
            return await self._failed(ctx, workflow, record, reason_of(exc), None)
        if sctx._finished is not None:
            return sctx._finished[0]
        async with ctx.transaction() as tx:
            return await finish(tx, result)

    async def _record(
        self, tx: Transaction, workflow: Workflow, record: WorkflowRecord, result: StepOutcome, now: dt.datetime
    ) -> Outcome | None:
        """Record a step's outcome (after its writes blocks committed); what the pass does next."""
        data = {**record.data, **(result.data or {})}
        cancelling = record.state == "cancelling"
        step = workflow.steps[record.step_index]
        if result.action == "next":
            await self._log(tx, record, "next")
            if cancelling:  # it completed: the cancellation compensates it too
                completed = max(record.completed, record.step_index + 1)
                await tx.repository(WORKFLOWS).update(attrs.evolve(record, data=data, completed=completed))
            else:
                await tx.repository(WORKFLOWS).update(self._advance(workflow, record, data))
            return None
        if result.action == "wait":
            event = result.event or ""
            await self._log(tx, record, "wait")
            completed = max(record.completed, record.step_index + 1)
            if cancelling:
                await tx.repository(WORKFLOWS).update(attrs.evolve(record, data=data, completed=completed))
                return None
            if event in record.inbox:  # the event came before the wait
                inbox = dict(record.inbox)
                payload = inbox.pop(event)
                await self._log(tx, record, "signaled")
                record = attrs.evolve(record, inbox=inbox)
                await tx.repository(WORKFLOWS).update(self._advance(workflow, record, {**data, event: payload}))
                return None
            wake_at = None if result.timeout is None else now + result.timeout
            await tx.repository(WORKFLOWS).update(
                attrs.evolve(
                    record,
                    state="waiting",
                    data=data,
                    completed=completed,
                    waiting_for=event,
                    on_timeout=result.on_timeout,
                    wake_at=wake_at,
                    reason=None,
                    message="",
                ),
            )
            return Outcome.done() if result.timeout is None else Outcome.requeue(result.timeout)
        if result.action == "fail":
            await self._log(tx, record, "failed", result.reason)
            if cancelling:
                await tx.repository(WORKFLOWS).update(attrs.evolve(record, data=data))
                return None
            await tx.repository(WORKFLOWS).update(
                attrs.evolve(record, state="failed", data=data, reason=result.reason, message=result.message)
            )
            return Outcome.done()
        # retry
        await self._log(tx, record, "retry", result.reason)
        record = attrs.evolve(record, data=data)
        if cancelling:
            await tx.repository(WORKFLOWS).update(record)
            return None
        return await self._next_attempt(tx, step, record, result.reason or "RETRY", result.message, result.after)

    async def _next_attempt(
        self,
        tx: Transaction,
        step: Step,
        record: WorkflowRecord,
        reason: str,
        message: str,
        delay: dt.timedelta | None,
    ) -> Outcome:
        """After a failed attempt: the next one after the backoff, or the workflow fails with the reason."""
        if record.attempt >= step.retry.max_attempts:
            what = "compensating step" if record.compensating else "step"
            await tx.repository(WORKFLOWS).update(
                attrs.evolve(
                    record,
                    state="failed",
                    reason=reason,
                    message=message or f"{what} {step.name!r} failed {record.attempt} times ({reason})",
                ),
            )
            return Outcome.done()
        if delay is None:
            delay = step.retry.delay(WORKFLOW_KIND, f"{record.id}/{step.name}", record.attempt)
        if record.compensating:  # the cancellation's reason stays; the log has the attempt's
            what = f"compensating step {step.name!r} failed on attempt {record.attempt} ({reason}); retrying"
            await tx.repository(WORKFLOWS).update(attrs.evolve(record, attempt=record.attempt + 1, message=what))
            return Outcome.requeue(delay)
        await tx.repository(WORKFLOWS).update(
            attrs.evolve(
                record,
                attempt=record.attempt + 1,
                reason=reason,
                message=message or f"attempt {record.attempt} of step {step.name!r} failed ({reason})",
            ),
        )
        return Outcome.requeue(delay)

    async def _failed(
        self, ctx: ReconcileContext, workflow: Workflow, snapshot: WorkflowRecord, reason: str, message: str | None
    ) -> Outcome | None:
        """Record a failed attempt (its writes rolled back) in a transaction of its own."""
        step = workflow.steps[snapshot.step_index]
        async with ctx.transaction() as tx:
            record = await tx.repository(WORKFLOWS).lock(snapshot.id)
            if record is None or (record.step_index, record.attempt, record.compensating) != (
                snapshot.step_index,
                snapshot.attempt,
                snapshot.compensating,
            ):
                return None
            await self._log(tx, record, "compensation_error" if record.compensating else "error", reason)
            if record.state == "cancelling" and not record.compensating:
                return None  # the step did not complete; the cancellation goes on without it
            if record.state not in ("running", "cancelling"):
                return None
            log.info("workflow %s: step %s attempt %d failed (%s)", record.id, step.name, record.attempt, reason)
            return await self._next_attempt(tx, step, record, reason, message or "", None)

    async def _compensate(self, ctx: ReconcileContext, workflow: Workflow, snapshot: WorkflowRecord) -> Outcome | None:
        """One step of a cancellation: compensate the last completed step, or end as cancelled."""
        if not snapshot.compensating:  # the cancellation begins: from the last completed step, backwards
            async with ctx.transaction() as tx:
                record = await tx.repository(WORKFLOWS).lock(snapshot.id)
                if record is None or record.state != "cancelling" or record.compensating:
                    return None
                await tx.repository(WORKFLOWS).update(self._compensating(workflow, record, record.completed))
            return None
        index = snapshot.completed - 1
        step = workflow.steps[index]
        if step.compensate is not None:
            sctx = StepContext(
                context=ctx.context,
                record=snapshot,
                step=step.name,
                step_index=index,
                attempt=snapshot.attempt,
                lease=ctx.lease,
                compensating=True,
            )
            try:
                with anyio.fail_after(step.deadline.total_seconds()):
                    await step.compensate(sctx)
            except Exception as exc:
                return await self._failed(ctx, workflow, snapshot, reason_of(exc), None)
            async with ctx.transaction() as tx:
                if not await self._compensated(tx, workflow, snapshot, "compensated"):
                    raise ConflictError("the workflow moved on while a compensation ran", details={"id": snapshot.id})
            return None
        async with ctx.transaction() as tx:
            await self._compensated(tx, workflow, snapshot, "no_compensation")
        return None

    async def _compensated(self, tx: Transaction, workflow: Workflow, snapshot: WorkflowRecord, outcome: str) -> bool:
        record = await tx.repository(WORKFLOWS).lock(snapshot.id)
        if (
            record is None
            or record.state != "cancelling"
            or not record.compensating
            or (record.completed, record.attempt) != (snapshot.completed, snapshot.attempt)
        ):
            return False
        await self._log(tx, record, outcome)
        await tx.repository(WORKFLOWS).update(self._compensating(workflow, record, record.completed - 1))
        return True

    def _compensating(self, workflow: Workflow, record: WorkflowRecord, completed: int) -> WorkflowRecord:
        """``record`` about to compensate its step ``completed - 1``, or cancelled when none is left."""
        common: dict[str, Any] = {"completed": completed, "attempt": 1}
        common.update(waiting_for=None, on_timeout=None, wake_at=None)
        if completed <= 0:
            return attrs.evolve(record, state="cancelled", compensating=False, **common)
        index = completed - 1
        return attrs.evolve(record, compensating=True, step_index=index, step=workflow.steps[index].name, **common)
