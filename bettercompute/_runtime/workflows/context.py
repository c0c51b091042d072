"""What a step gets (``StepContext``: its workflow, its write blocks, its idempotency key) and what it returns
(``StepOutcome``)."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import attrs

from bettercompute._runtime.reconcile import Outcome
from bettercompute.errors import InvalidInputError
from bettercompute.ports import Clock, Lease, Store, Transaction, WorkflowRecord

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext


__all__ = ["COMMIT_MARGIN", "StepContext", "StepOutcome", "checked_reason"]

COMMIT_MARGIN = 2.0
"""Seconds a pass keeps free after a step's deadline to commit its outcome, when it runs several steps."""


def checked_reason(value: str) -> str:
    """``value`` when it is a machine-readable reason code."""
    if not isinstance(value, str) or not value or len(value) > 200 or any(c.isspace() for c in value):
        raise InvalidInputError("a reason is a machine-readable code: 1-200 characters, no spaces")
    return value


log = logging.getLogger("bettercompute.workflows")


@attrs.frozen(kw_only=True)
class StepOutcome:
    """What a step returns: ``next``, ``wait``, ``retry`` or ``fail`` (build it with those class methods)."""

    action: str
    data: Mapping[str, Any] | None = None
    event: str | None = None
    timeout: dt.timedelta | None = None
    on_timeout: str = "fail"
    after: dt.timedelta = dt.timedelta(0)
    reason: str | None = None
    message: str = ""

    @classmethod
    def next(cls, data: Mapping[str, Any] | None = None) -> StepOutcome:
        """The step is done: go on with the next one (or succeed after the last). ``data``'s keys are merged into
        the workflow's data (replacing those keys)."""
        return cls(action="next", data=data)

    @classmethod
    def wait(
        cls,
        event: str,
        *,
        timeout: dt.timedelta | None = None,
        on_timeout: str = "fail",
        data: Mapping[str, Any] | None = None,
    ) -> StepOutcome:
        """The step is done but the workflow goes on only once ``event`` is signalled (``Workflows.signal``); its
        payload is then in the data under ``event``. Parks without holding a worker.

        Args:
            event: The event's name.
            timeout: How long to wait; ``None`` waits forever.
            on_timeout: ``"fail"`` (reason ``WAIT_TIMEOUT``) or ``"next"`` (go on without the event's key).
            data: Merged into the workflow's data before parking.
        """
        if not event:
            raise InvalidInputError("wait needs an event name")
        if on_timeout not in ("fail", "next"):
            raise InvalidInputError("on_timeout is 'fail' or 'next'")
        if timeout is not None and timeout <= dt.timedelta(0):
            raise InvalidInputError("a wait's timeout must be positive")
        return cls(action="wait", event=event, timeout=timeout, on_timeout=on_timeout, data=data)

    @classmethod
    def retry(cls, after: dt.timedelta = dt.timedelta(0), *, reason: str = "RETRY", message: str = "") -> StepOutcome:
        """Run the step again after ``after`` (an attempt of the step's ``RetryPolicy``; its writes commit)."""
        return cls(action="retry", after=after, reason=checked_reason(reason), message=message)

    @classmethod
    def fail(cls, reason: str, message: str = "") -> StepOutcome:
        """Fail the workflow with a machine-readable ``reason`` (its writes commit)."""
        return cls(action="fail", reason=checked_reason(reason), message=message)


class StepContext:
    """What one attempt of a step (or of its compensation) gets.

    Write inside ``async with ctx.writes() as tx:`` blocks; call outside systems between them, never inside one.
    """

    def __init__(
        self,
        *,
        context: ModuleContext,
        record: WorkflowRecord,
        step: str,
        step_index: int,
        attempt: int,
        lease: Lease | None,
        compensating: bool = False,
    ) -> None:
        self.context = context
        self.workflow_id = record.id
        self.type = record.type
        self.tenant = record.tenant
        self.subject = record.subject
        self.step = step
        self.step_index = step_index
        self.attempt = attempt
        self.compensating = compensating
        self.data: dict[str, Any] = dict(record.data)
        self._lease = lease
        self._writing = False
        self._finish: Callable[[Transaction, StepOutcome], Awaitable[Outcome | None]] | None = None
        # Set once a block's transaction recorded the step's outcome: what the engine's pass does next.
        self._finished: tuple[Outcome | None] | None = None

    @property
    def store(self) -> Store:
        """The store (for reads; write inside ``writes()``)."""
        return self.context.store

    @property
    def clock(self) -> Clock:
        """The control plane's clock."""
        return self.context.clock

    @property
    def idempotency_key(self) -> str:
        """``<workflow id>/<step>/<attempt>``: the same when a crashed attempt is resumed, new for a retry."""
        prefix = "compensate:" if self.compensating else ""
        return f"{self.workflow_id}/{prefix}{self.step}/{self.attempt}"

    def writes(self, *, outcome: StepOutcome | None = None) -> AbstractAsyncContextManager[Transaction]:
        """A block for the step's writes: a transaction fenced by the shard lease, committed when the block ends
        (rolled back if it raises). Make no outside call inside it: it holds a pooled connection and the lease's
        share lock for as long as the call would take.

        Args:
            outcome: The step's outcome, recorded in this block's transaction so that the writes and the workflow's
                progress commit together. The block is then the step's last: the step returns right after it (the
                engine keeps the recorded outcome, whatever is returned) and opens no other block.

        Raises:
            RuntimeError: the step opened a block inside another one, or after the block that recorded its outcome;
                a compensation gave an outcome (it has none).
            FailedPreconditionError: the shard lease was lost (nothing in the block is written).
        """
        if outcome is not None and not isinstance(outcome, StepOutcome):
            raise TypeError(f"outcome is a StepOutcome, not {type(outcome).__name__}")
        return self._writes(outcome)

    @contextlib.asynccontextmanager
    async def _writes(self, outcome: StepOutcome | None) -> AsyncIterator[Transaction]:
        if self._writing:
            raise RuntimeError("a step's writes blocks do not nest; end one before opening the next")
        if self._finished is not None:
            raise RuntimeError("the step's outcome is recorded already; its last block has ended")
        if outcome is not None and self._finish is None:
            raise RuntimeError("a compensation has no outcome to record")
        self._writing = True
        finished: tuple[Outcome | None] | None = None
        try:
            async with self.context.store.transaction(fence=self._lease) as tx:
                yield tx
                if outcome is not None and self._finish is not None:
                    finished = (await self._finish(tx, outcome),)
            self._finished = finished  # only once committed
        finally:
            self._writing = False
