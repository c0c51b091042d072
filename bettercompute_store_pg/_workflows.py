"""Workflows and their step logs (``bettercompute.ports.WorkflowStore``, reached by the key ``WORKFLOWS``)."""

from __future__ import annotations

from typing import Any

from bettercompute.errors import ConflictError
from bettercompute.ports import WorkflowLogEntry, WorkflowRecord

from ._db import Database, dumps, utc
from ._repository import PgRepository

__all__ = ["PgWorkflows"]

_COLUMNS = (
    "id, type, tenant, subject, state, step_index, step, attempt, completed, compensating, reason, message, data,"
    " inbox, waiting_for, on_timeout, wake_at, created_at, updated_at"
)

_INSERT = """
INSERT INTO {s}.workflows (id, type, tenant, subject, state, step_index, step, attempt, completed, data)
VALUES (:id, :type, :tenant, :subject, :state, :step_index, :step, :attempt, :completed, CAST(:data AS jsonb))
ON CONFLICT (id) DO NOTHING
RETURNING id
"""

_GET = f"SELECT {_COLUMNS} FROM {{s}}.workflows WHERE id = :id"
_LOCK = f"SELECT {_COLUMNS} FROM {{s}}.workflows WHERE id = :id FOR UPDATE"

_UPDATE = """
UPDATE {s}.workflows SET
    state = :state, step_index = :step_index, step = :step, attempt = :attempt, completed = :completed,
    compensating = :compensating, reason = :reason, message = :message, data = CAST(:data AS jsonb),
    inbox = CAST(:inbox AS jsonb), waiting_for = :waiting_for, on_timeout = :on_timeout,
    wake_at = CAST(:wake_at AS timestamptz), updated_at = now()
WHERE id = :id
"""

_LOG = """
INSERT INTO {s}.workflow_steps (workflow_id, step_index, step, attempt, outcome, reason)
VALUES (:workflow_id, :step_index, :step, :attempt, :outcome, :reason)
"""

_HISTORY = """
SELECT * FROM (
    SELECT id, workflow_id, step_index, step, attempt, outcome, reason, at FROM {s}.workflow_steps
    WHERE workflow_id = :id ORDER BY id DESC LIMIT :limit
) AS newest ORDER BY id
"""


def _record(row: Any) -> WorkflowRecord:
    return WorkflowRecord(
        id=row.id,
        type=row.type,
        tenant=row.tenant,
        subject=row.subject,
        state=row.state,
        step_index=row.step_index,
        step=row.step,
        attempt=row.attempt,
        completed=row.completed,
        compensating=row.compensating,
        reason=row.reason,
        message=row.message,
        data=row.data,
        inbox=row.inbox,
        waiting_for=row.waiting_for,
        on_timeout=row.on_timeout,
        wake_at=None if row.wake_at is None else utc(row.wake_at),
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
    )


class PgWorkflows(PgRepository):
    """``bettercompute.ports.WorkflowStore`` on the ``workflows`` and ``workflow_steps`` tables. Every write and
    ``lock`` needs a transaction (``tx.repository(WORKFLOWS)``)."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._insert = db.sql(_INSERT)
        self._get = db.sql(_GET)
        self._lock = db.sql(_LOCK)
        self._update = db.sql(_UPDATE)
        self._log = db.sql(_LOG)
        self._history = db.sql(_HISTORY)

    async def insert(self, record: WorkflowRecord) -> None:
        """Add a workflow; ``ConflictError`` if its id is taken."""
        params = {
            "id": record.id,
            "type": record.type,
            "tenant": record.tenant,
            "subject": record.subject,
            "state": record.state,
            "step_index": record.step_index,
            "step": record.step,
            "attempt": record.attempt,
            "completed": record.completed,
            "data": dumps(dict(record.data)),
        }
        if not await self._fetch_in_transaction("insert", self._insert, params):
            raise ConflictError("a workflow with this id exists", details={"id": record.id})

    async def get(self, id: str) -> WorkflowRecord | None:
        """The workflow, or ``None``."""
        rows = await self._fetch(self._get, {"id": id})
        return _record(rows[0]) if rows else None

    async def lock(self, id: str) -> WorkflowRecord | None:
        """The workflow, row-locked until the transaction ends."""
        rows = await self._fetch_in_transaction("lock", self._lock, {"id": id})
        return _record(rows[0]) if rows else None

    async def update(self, record: WorkflowRecord) -> None:
        """Write the mutable fields."""
        params = {
            "id": record.id,
            "state": record.state,
            "step_index": record.step_index,
            "step": record.step,
            "attempt": record.attempt,
            "completed": record.completed,
            "compensating": record.compensating,
            "reason": record.reason,
            "message": record.message,
            "data": dumps(dict(record.data)),
            "inbox": dumps(dict(record.inbox)),
            "waiting_for": record.waiting_for,
            "on_timeout": record.on_timeout,
            "wake_at": record.wake_at,
        }
        await self._fetch_in_transaction("update", self._update, params)

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
        """Append a step log line."""
        params = {
            "workflow_id": workflow_id,
            "step_index": step_index,
            "step": step,
            "attempt": attempt,
            "outcome": outcome,
            "reason": reason,
        }
        await self._fetch_in_transaction("log", self._log, params)

    async def history(self, id: str, *, limit: int = 1000) -> list[WorkflowLogEntry]:
        """The step log, oldest first."""
        rows = await self._fetch(self._history, {"id": id, "limit": limit})
        return [
            WorkflowLogEntry(
                id=row.id,
                workflow_id=row.workflow_id,
                step_index=row.step_index,
                step=row.step,
                attempt=row.attempt,
                outcome=row.outcome,
                reason=row.reason,
                at=utc(row.at),
            )
            for row in rows
        ]
