"""Commands for daemons and daemon sessions (``Commands`` and ``Sessions``).

Every state change is one statement guarded by the state it leaves, so the sweeper, a gateway and a retry never
apply one change twice. A session is current while its row carries the node's latest epoch and is not closed; it is
alive while, in addition, a gateway reported it recently. The sweeper settles commands dispatched on sessions that
are not alive.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bettercompute.errors import InternalError, NotFoundError
from bettercompute.modules.commands import CommandRecord, LostSession, SessionRecord
from bettercompute.modules.nodes import InstructionSignature
from bettercompute.ports import WorkItem
from bettercompute_store_pg._db import Database, dumps, utc
from bettercompute_store_pg._repository import PgRepository

from ._edge import PgEdge
from ._rows import command_of, optional_time

__all__ = ["REPOSITORIES", "PgCommands", "PgSessions"]

_COLUMNS = (
    "id, node_id, tenant, kind, payload, state, on_session_loss, deadline, attempts, max_attempts, session_epoch, "
    "dispatched_at, result, reason, created_at, updated_at, finished_at, wake_kind, wake_key, wake_shard, "
    "result_json, signature, signer_serial, signer_key, arguments_json, instruction_signature, instruction_signer"
)
_C_COLUMNS = ", ".join(f"c.{c.strip()}" for c in _COLUMNS.split(","))

_CREATE = f"""
INSERT INTO {{s}}.commands (id, node_id, tenant, kind, payload, state, on_session_loss, deadline, max_attempts,
    wake_kind, wake_key, wake_shard, arguments_json, instruction_signature, instruction_signer)
VALUES (:id, :node_id, :tenant, :kind, CAST(CAST(:payload AS text) AS jsonb), 'pending', :on_session_loss, :deadline,
    :max_attempts, :wake_kind, :wake_key, :wake_shard, CAST(:payload AS text), :signature, :signer)
RETURNING {_COLUMNS}
"""

_GET = f"SELECT {_COLUMNS} FROM {{s}}.commands WHERE id = :id"

_DISPATCH = f"""
WITH picked AS (
    SELECT id FROM {{s}}.commands
    WHERE node_id = :node_id AND state = 'pending' AND deadline > :now
    ORDER BY created_at, id LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE {{s}}.commands AS c SET state = 'dispatched', session_epoch = :epoch, dispatched_at = :now,
    attempts = c.attempts + 1, updated_at = :now
FROM picked WHERE c.id = picked.id
RETURNING {_C_COLUMNS}
"""

# ``_DISPATCH`` for many sessions at once: per node, its oldest pending commands (the partial index
# ``commands_pending`` answers each probe).
_FINISH = f"""
UPDATE {{s}}.commands AS c SET state = :state, result = CAST(:result AS jsonb), reason = :reason,
    finished_at = now(), updated_at = now()
WHERE c.id = :id AND c.state = 'dispatched' AND c.session_epoch = :epoch
RETURNING {_C_COLUMNS}
"""

_EXPIRE = f"""
WITH due AS (
    SELECT id FROM {{s}}.commands
    WHERE state IN ('pending', 'dispatched') AND deadline <= :now
    ORDER BY deadline, id LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE {{s}}.commands AS c SET state = 'expired', reason = 'deadline_exceeded', finished_at = :now, updated_at = :now
FROM due WHERE c.id = due.id
RETURNING {_C_COLUMNS}
"""

# A dispatched command is orphaned when its node's session row is gone, carries another epoch, is closed, or was
# not seen since ``stale_before``.
_ORPHANED = f"""
WITH orphan AS (
    SELECT c.id FROM {{s}}.commands AS c
    LEFT JOIN {{s}}.sessions AS s ON s.node_id = c.node_id
    WHERE c.state = 'dispatched' AND c.deadline > :now
      AND (s.node_id IS NULL OR s.epoch <> c.session_epoch OR s.closed_at IS NOT NULL
           OR s.last_seen_at < :stale_before)
    ORDER BY c.dispatched_at, c.id LIMIT :limit
    FOR UPDATE OF c SKIP LOCKED
),
settled AS (
    SELECT o.id,
        CASE WHEN c.on_session_loss = 'redispatch' AND c.attempts < c.max_attempts THEN 'pending' ELSE 'failed' END
            AS next_state,
        CASE WHEN c.on_session_loss = 'redispatch' AND c.attempts < c.max_attempts THEN NULL
             WHEN c.on_session_loss = 'redispatch' THEN 'attempts_exhausted'
             ELSE 'session_lost' END AS next_reason
    FROM orphan AS o JOIN {{s}}.commands AS c ON c.id = o.id
)
UPDATE {{s}}.commands AS c SET state = settled.next_state, reason = settled.next_reason,
    session_epoch = CASE WHEN settled.next_state = 'pending' THEN NULL ELSE c.session_epoch END,
    dispatched_at = CASE WHEN settled.next_state = 'pending' THEN NULL ELSE c.dispatched_at END, updated_at = :now,
    finished_at = CASE WHEN settled.next_state = 'failed' THEN CAST(:now AS timestamptz) END
FROM settled WHERE c.id = settled.id
RETURNING {_C_COLUMNS}
"""

_SESSION_COLUMNS = "node_id, epoch, gateway, opened_at, last_seen_at, closed_at"

# The node's epoch and its sessions row move together; the node's row lock orders concurrent opens.
_OPEN = f"""
WITH bumped AS (
    UPDATE {{s}}.nodes SET session_epoch = session_epoch + 1, last_seen_at = now(), updated_at = now()
    WHERE id = :node_id AND state <> 'retired'
    RETURNING id, session_epoch
)
INSERT INTO {{s}}.sessions AS s (node_id, epoch, gateway, opened_at, last_seen_at, closed_at)
SELECT id, session_epoch, :gateway, now(), now(), NULL FROM bumped
ON CONFLICT (node_id) DO UPDATE SET epoch = EXCLUDED.epoch, gateway = EXCLUDED.gateway,
    opened_at = EXCLUDED.opened_at, last_seen_at = EXCLUDED.last_seen_at, closed_at = NULL, unreachable_at = NULL
RETURNING {_SESSION_COLUMNS}
"""

_SEEN = """
WITH alive AS (
    SELECT * FROM unnest(CAST(:node_ids AS text[]), CAST(:epochs AS bigint[])) AS a (node_id, epoch)
),
touched AS (
    UPDATE {s}.sessions AS s SET last_seen_at = now()
    FROM alive WHERE s.node_id = alive.node_id AND s.epoch = alive.epoch AND s.gateway = :gateway
      AND s.closed_at IS NULL
    RETURNING s.node_id
)
UPDATE {s}.nodes AS n SET last_seen_at = now() FROM touched WHERE n.id = touched.node_id
RETURNING n.id
"""

_CLOSE = """
UPDATE {s}.sessions SET closed_at = now() WHERE node_id = :node_id AND epoch = :epoch AND closed_at IS NULL
RETURNING node_id
"""

_SESSION_GET = f"SELECT {_SESSION_COLUMNS} FROM {{s}}.sessions WHERE node_id = :node_id"

# A session last seen before ``stale_before`` (and, when closed, closed before it too) is marked once; one still open
# is closed here. The partial index ``sessions_unmarked`` keeps the probe to the unmarked rows.
_UNREACHABLE = """
WITH lost AS (
    SELECT s.node_id, s.closed_at AS was_closed, n.state = 'retired' AS retired
    FROM {s}.sessions AS s JOIN {s}.nodes AS n ON n.id = s.node_id
    WHERE s.unreachable_at IS NULL AND s.last_seen_at < :stale_before
      AND (s.closed_at IS NULL OR s.closed_at < :stale_before)
    ORDER BY s.last_seen_at, s.node_id LIMIT :limit
    FOR UPDATE OF s SKIP LOCKED
)
UPDATE {s}.sessions AS s SET unreachable_at = :now, closed_at = COALESCE(s.closed_at, :now)
FROM lost WHERE s.node_id = lost.node_id
RETURNING s.node_id, s.epoch, s.gateway, s.last_seen_at, lost.was_closed IS NULL AS closed_by_sweep, lost.retired
"""


def _session(row: Any) -> SessionRecord:
    return SessionRecord(
        node_id=row.node_id,
        epoch=row.epoch,
        gateway=row.gateway,
        opened_at=utc(row.opened_at),
        last_seen_at=utc(row.last_seen_at),
        closed_at=optional_time(row.closed_at),
    )


class PgCommands(PgRepository):
    """``Commands`` on the ``commands`` table (the commands module's migrations); one statement per call."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._create = db.sql(_CREATE)
        self._get = db.sql(_GET)
        self._dispatch = db.sql(_DISPATCH)
        self._finish = db.sql(_FINISH)
        self._expire = db.sql(_EXPIRE)
        self._orphaned = db.sql(_ORPHANED)

    async def create(
        self,
        *,
        id: str,
        node_id: str,
        tenant: str,
        kind: str,
        payload: Mapping[str, Any],
        deadline: dt.datetime,
        on_session_loss: str,
        max_attempts: int,
        wake: WorkItem | None = None,
        arguments_json: str | None = None,
        instruction: InstructionSignature | None = None,
    ) -> CommandRecord:
        """Add a ``pending`` command in the caller's transaction."""
        params = {
            "id": id,
            "node_id": node_id,
            "tenant": tenant,
            "kind": kind,
            "payload": arguments_json if arguments_json is not None else dumps(dict(payload)),
            "signature": instruction.signature if instruction is not None else None,
            "signer": instruction.signer if instruction is not None else None,
            "deadline": deadline,
            "on_session_loss": on_session_loss,
            "max_attempts": max_attempts,
            "wake_kind": wake.kind if wake is not None else None,
            "wake_key": wake.key if wake is not None else None,
            "wake_shard": wake.shard if wake is not None else None,
        }
        rows = await self._fetch_in_transaction("create", self._create, params)
        return command_of(rows[0])

    async def get(self, id: str) -> CommandRecord | None:
        """A command by id."""
        rows = await self._fetch(self._get, {"id": id})
        return command_of(rows[0]) if rows else None

    async def dispatch(self, *, node_id: str, epoch: int, now: dt.datetime, limit: int) -> list[CommandRecord]:
        """Mark the node's oldest pending commands dispatched on ``epoch``."""
        params = {"node_id": node_id, "epoch": epoch, "now": now, "limit": limit}
        rows = await self._fetch(self._dispatch, params)
        return sorted((command_of(r) for r in rows), key=lambda c: (c.created_at, c.id))

    async def finish(
        self, *, id: str, epoch: int, state: str, result: Mapping[str, Any], reason: str | None
    ) -> CommandRecord | None:
        """Record a dispatched command's outcome."""
        if state not in ("succeeded", "failed"):
            raise InternalError("a command finishes as succeeded or failed")
        params = {"id": id, "epoch": epoch, "state": state, "result": dumps(dict(result)), "reason": reason}
        rows = await self._fetch(self._finish, params)
        return command_of(rows[0]) if rows else None

    async def expire(self, *, now: dt.datetime, limit: int) -> list[CommandRecord]:
        """Expire open commands past their deadline."""
        rows = await self._fetch_in_transaction("expire", self._expire, {"now": now, "limit": limit})
        return [command_of(r) for r in rows]

    async def orphaned(self, *, stale_before: dt.datetime, now: dt.datetime, limit: int) -> list[CommandRecord]:
        """Re-queue or fail dispatched commands whose session died."""
        params = {"stale_before": stale_before, "now": now, "limit": limit}
        rows = await self._fetch_in_transaction("orphaned", self._orphaned, params)
        return [command_of(r) for r in rows]


class PgSessions(PgRepository):
    """``Sessions`` on the ``sessions`` table (the commands module's migrations) and the nodes' ``session_epoch``."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._open = db.sql(_OPEN)
        self._seen = db.sql(_SEEN)
        self._close = db.sql(_CLOSE)
        self._get = db.sql(_SESSION_GET)
        self._unreachable = db.sql(_UNREACHABLE)

    async def open(self, *, node_id: str, gateway: str) -> SessionRecord:
        """Open the node's next session.

        Raises:
            NotFoundError: no such node, or it is retired.
        """
        rows = await self._fetch(self._open, {"node_id": node_id, "gateway": gateway})
        if not rows:
            raise NotFoundError("no such live node", details={"node_id": node_id})
        return _session(rows[0])

    async def seen(self, alive: Sequence[tuple[str, int]], *, gateway: str) -> list[str]:
        """Mark these sessions seen now; the node ids whose session was still current."""
        if not alive:
            return []
        params = {"node_ids": [a[0] for a in alive], "epochs": [a[1] for a in alive], "gateway": gateway}
        return [r.id for r in await self._fetch(self._seen, params)]

    async def close(self, *, node_id: str, epoch: int) -> bool:
        """End session ``epoch`` of the node."""
        return bool(await self._fetch(self._close, {"node_id": node_id, "epoch": epoch}))

    async def get(self, node_id: str) -> SessionRecord | None:
        """The node's latest session."""
        rows = await self._fetch(self._get, {"node_id": node_id})
        return _session(rows[0]) if rows else None

    async def unreachable(self, *, stale_before: dt.datetime, now: dt.datetime, limit: int) -> list[LostSession]:
        """Mark nodes whose last session went quiet unreachable (once per session), in one statement."""
        params = {"stale_before": stale_before, "now": now, "limit": limit}
        rows = await self._fetch_in_transaction("unreachable", self._unreachable, params)
        return [
            LostSession(
                node_id=r.node_id,
                epoch=r.epoch,
                gateway=r.gateway,
                last_seen_at=utc(r.last_seen_at),
                closed_by_sweep=r.closed_by_sweep,
                retired=r.retired,
            )
            for r in rows
        ]


REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {
    "commands": PgCommands,
    "sessions": PgSessions,
    "edge": PgEdge,
}
"""The adapters of this module's repositories, by ``Repository.name``."""
