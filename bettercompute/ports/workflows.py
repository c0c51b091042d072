"""Persisted workflows and their step log."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from bettercompute.ports.repository import Repository

__all__ = ["WORKFLOWS", "WorkflowLogEntry", "WorkflowRecord", "WorkflowStore"]


@attrs.frozen(kw_only=True)
class WorkflowRecord:
    """One workflow as stored (``bettercompute.Workflows`` returns it from ``get``).

    ``state`` is ``running``, ``waiting``, ``succeeded``, ``failed``, ``cancelling`` or ``cancelled``. ``step_index``
    and ``step`` name the current step (while cancelling: the step being compensated; once succeeded: the index past
    the last step, ``step`` ``None``); ``attempt`` counts the current step's attempts from 1. ``completed`` is how many
    steps have applied their effect (the ones a cancellation compensates). ``reason`` is a machine-readable code of
    why the workflow failed, was cancelled or is retrying, ``message`` its human text. ``data`` is the state passed
    from step to step. While ``waiting``, ``waiting_for`` is the event awaited and ``wake_at`` when the wait times out
    (``on_timeout``: ``fail`` or ``next``). ``inbox`` holds signals received before their wait (event -> payload).
    """

    id: str
    type: str
    tenant: str
    subject: str
    state: str
    step_index: int
    step: str | None
    attempt: int
    completed: int = 0
    compensating: bool = False
    reason: str | None = None
    message: str = ""
    data: Mapping[str, Any] = attrs.field(factory=dict)
    inbox: Mapping[str, Any] = attrs.field(factory=dict)
    waiting_for: str | None = None
    on_timeout: str | None = None
    wake_at: dt.datetime | None = None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None


@attrs.frozen(kw_only=True)
class WorkflowLogEntry:
    """One line of a workflow's step log: what an attempt of a step (or of its compensation) came to."""

    id: int
    workflow_id: str
    step_index: int
    step: str
    attempt: int
    outcome: str
    reason: str | None
    at: dt.datetime


class WorkflowStore(Protocol):
    """Workflows and their step logs (the state of ``bettercompute.Workflows``), reached by the key ``WORKFLOWS``.

    Every write, and ``lock``, is made through ``tx.repository(WORKFLOWS)`` so that a step's own writes and the
    workflow's progress commit together; on ``store.repository(WORKFLOWS)`` they raise ``InternalError``. ``get``
    and ``history`` work on either.
    """

    async def insert(self, record: WorkflowRecord) -> None:
        """Add a workflow (its timestamps are the store's now). ``ConflictError`` if the id exists."""
        ...

    async def get(self, id: str) -> WorkflowRecord | None:
        """The workflow, or ``None``."""
        ...

    async def lock(self, id: str) -> WorkflowRecord | None:
        """The workflow, locked against other writers until the transaction ends (``None`` when there is none)."""
        ...

    async def update(self, record: WorkflowRecord) -> None:
        """Write the mutable fields of ``record`` (all but id, type, tenant, subject, created_at); updated_at is now."""
        ...

    async def log(
        self,
        *,
        workflow_id: str,
        step_index: int,
        step: str,
        attempt: int,
        outcome: str,
        reason: str | None,
    ) -> None:
        """Append a line to the workflow's step log."""
        ...

    async def history(self, id: str, *, limit: int = 1000) -> list[WorkflowLogEntry]:
        """The workflow's step log, oldest first (the newest ``limit`` lines)."""
        ...


WORKFLOWS: Repository[WorkflowStore] = Repository(module="runtime", name="workflows")
"""``tx.repository(WORKFLOWS)`` (or, outside a transaction, ``store.repository(WORKFLOWS)``): the store's
``WorkflowStore``."""
