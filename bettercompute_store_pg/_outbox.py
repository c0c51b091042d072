"""The outbox: events numbered per key in commit order, handed out one key-head at a time.

Delivered events are deleted by ``ack``; ``outbox_keys`` keeps each key's last number so numbering carries on.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from bettercompute.ports import OutboxEvent, StoredEvent

from ._db import Connection, Database, defer_in, dumps, utc

__all__ = ["PgOutbox"]

# The outbox_keys upsert locks each key's row until the writing transaction ends, so a second writer of the same key
# waits and gets the next number only after the first commits (or rolls back): numbers follow commit order.
_PUBLISH = """
WITH ev AS (
    SELECT * FROM jsonb_to_recordset(CAST(:events AS jsonb)) AS e(ord integer, type text, key text, payload jsonb)
), counts AS (
    SELECT key, count(*) AS n FROM ev GROUP BY key
), numbered AS (
    INSERT INTO {s}.outbox_keys AS k (key, last_seq)
    SELECT key, n FROM counts ORDER BY key
    ON CONFLICT (key) DO UPDATE SET last_seq = k.last_seq + EXCLUDED.last_seq
    RETURNING k.key, k.last_seq
)
INSERT INTO {s}.outbox (type, key, seq, payload)
SELECT ev.type, ev.key, numbered.last_seq - counts.n + row_number() OVER (PARTITION BY ev.key ORDER BY ev.ord),
    ev.payload
FROM ev JOIN counts USING (key) JOIN numbered USING (key)
"""

# Only the head (lowest seq) of each key is a candidate, so at most one event per key is out at a time, and the
# next one becomes a candidate only once the head is acked (deleted).
_CLAIM = """
WITH picked AS (
    SELECT o.id FROM {s}.outbox AS o
    WHERE o.available_at <= now()
      AND (o.claimed_until IS NULL OR o.claimed_until <= now())
      AND NOT EXISTS (SELECT 1 FROM {s}.outbox AS p WHERE p.key = o.key AND p.seq < o.seq)
    ORDER BY o.id LIMIT :limit
    FOR UPDATE SKIP LOCKED
)
UPDATE {s}.outbox AS o SET
    claim_token = gen_random_uuid()::text, claimed_by = :holder, claimed_until = now() + :claim_for
FROM picked WHERE o.id = picked.id
RETURNING o.id, o.type, o.key, o.seq, o.payload, o.created_at, o.claim_token
"""

_ACK = """
DELETE FROM {s}.outbox AS o
USING unnest(CAST(:ids AS bigint[]), CAST(:tokens AS text[])) AS a(id, token)
WHERE o.id = a.id AND o.claim_token = a.token
"""

_RELEASE = """
UPDATE {s}.outbox AS o SET
    claim_token = NULL, claimed_by = NULL, claimed_until = NULL, available_at = now() + :delay
FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS text[])) AS a(id, token)
WHERE o.id = a.id AND o.claim_token = a.token
"""


def _stored(row: Any) -> StoredEvent:
    return StoredEvent(
        id=row.id,
        type=row.type,
        key=row.key,
        seq=row.seq,
        payload=row.payload,
        created_at=utc(row.created_at),
        token=row.claim_token,
    )


def _pairs(events: Sequence[StoredEvent]) -> dict[str, Any]:
    return {"ids": [e.id for e in events], "tokens": [e.token for e in events]}


class PgOutbox:
    """``bettercompute.ports.Outbox`` on the ``outbox`` and ``outbox_keys`` tables."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._publish = db.sql(_PUBLISH)
        self._claim = db.sql(_CLAIM)
        self._ack = db.sql(_ACK)
        self._release = db.sql(_RELEASE)

    async def publish_in(self, conn: Connection, events: Sequence[OutboxEvent]) -> None:
        """Record events in the caller's transaction (visible once it commits)."""
        if events:
            payload = [
                {"ord": n, "type": e.type, "key": e.key, "payload": dict(e.payload)} for n, e in enumerate(events)
            ]
            defer_in(conn, self._publish, {"events": dumps(payload)})

    async def claim(self, *, holder: str, limit: int, claim_for: dt.timedelta) -> list[StoredEvent]:
        """Claim up to ``limit`` deliverable events, at most one per key, oldest first."""
        if limit <= 0:
            return []
        rows = await self._db.fetch(self._claim, {"holder": holder, "limit": limit, "claim_for": claim_for})
        return sorted((_stored(row) for row in rows), key=lambda e: e.id)

    async def ack(self, events: Sequence[StoredEvent]) -> int:
        """Delete delivered events still held by these claims; returns how many were."""
        return await self._db.rowcount(self._ack, _pairs(events)) if events else 0

    async def release(self, events: Sequence[StoredEvent], *, delay: dt.timedelta) -> int:
        """Hand claimed events back, deliverable again after ``delay``; returns how many were still held."""
        return await self._db.rowcount(self._release, {**_pairs(events), "delay": delay}) if events else 0
