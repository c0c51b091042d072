"""The work queue: one row per ``(kind, key)``, claimed with ``FOR UPDATE SKIP LOCKED``.

A key being worked on keeps its single row in state ``claimed``; enqueuing it again meanwhile records a rerun on that
row (``rerun_at``, ``rerun_payload``) which ``complete`` and ``retry`` turn back into a ready row. So there is never a
second row a second claimer could take, and every call below is one statement.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import attrs

from bettercompute.ports import Claim, Lease, WorkItem

from ._db import Connection, Database, Statement, defer_in, dumps, utc, when

__all__ = ["PgWorkQueue", "claim_sql", "complete_sql", "retry_sql"]

# Duplicates inside one batch are merged first: ON CONFLICT cannot touch one row twice in a statement.
_ENQUEUE = """
INSERT INTO {s}.work_queue AS q (kind, key, shard, payload, run_at)
SELECT DISTINCT ON (i.kind, i.key)
    i.kind, i.key, i.shard, i.payload, min(COALESCE(i.run_at, now())) OVER (PARTITION BY i.kind, i.key)
FROM jsonb_to_recordset(CAST(:items AS jsonb))
    AS i(ord integer, kind text, key text, shard smallint, payload jsonb, run_at timestamptz)
ORDER BY i.kind, i.key, i.ord DESC
ON CONFLICT (kind, key) DO UPDATE SET
    shard = EXCLUDED.shard,
    run_at = CASE WHEN q.state = 'ready' THEN LEAST(q.run_at, EXCLUDED.run_at) ELSE q.run_at END,
    payload = CASE WHEN q.state = 'ready' THEN EXCLUDED.payload ELSE q.payload END,
    rerun_at = CASE WHEN q.state = 'claimed' THEN LEAST(q.rerun_at, EXCLUDED.run_at) END,
    rerun_payload = CASE WHEN q.state = 'claimed' THEN EXCLUDED.payload END
"""

_FENCE_CTE = """fence AS (
    SELECT 1 FROM {s}.leases
    WHERE name = :lease_name AND holder = :lease_holder AND token = :lease_token AND expires_at > now()
    FOR KEY SHARE
), """


# What "now" is for due times and delays: the ``:now`` parameter when given (an injected clock), else the database's.
_NOW = "COALESCE(CAST(:now AS timestamptz), now())"


@functools.cache
def claim_sql(*, shards: bool, fence: bool, clock: bool = False, owned: bool = False) -> str:
    """The claim statement (``{s}`` stands for the schema), with or without the shard filter and the lease check;
    with ``clock``, a ``:now`` parameter (``NULL`` for the database's clock) decides what is due.

    Ready rows that are due and claimed rows whose claim expired are both candidates; each branch takes its own
    partial index. Ready rows are read per kind (``kind = ANY(...)`` would not let the index give ``run_at``
    order, and PostgreSQL would sort every ready row on each claim). A reclaimed row absorbs a pending rerun, since
    its new claimer sees the latest state anyway.
    """
    now = _NOW if clock else "now()"
    extra = ""
    # With ``owned``: only shards whose lease this holder still has, so a worker that paused past its TTL and lost
    # its shards claims nothing there, even before it has noticed.
    if shards and owned:
        # The leases are read once per statement into an array (an InitPlan). As a per-row EXISTS, once the leases
        # had more than one holder PostgreSQL joined every ready row to them and sorted the lot (a seq scan, 7-10 ms
        # a claim with 20,000 rows queued) instead of reading the ready index in order.
        extra += (
            " AND shard = ANY(ARRAY(SELECT u.n FROM unnest(CAST(:shards AS smallint[])) AS u(n) WHERE EXISTS ("
            "SELECT 1 FROM {s}.leases AS o WHERE o.name = :owner_prefix || u.n::text"
            " AND o.holder = :holder AND o.expires_at > now())))"
        )
    elif shards:
        extra += " AND shard = ANY(CAST(:shards AS smallint[]))"
    elif owned:
        extra += (
            " AND EXISTS (SELECT 1 FROM {s}.leases AS o WHERE o.name = :owner_prefix || shard::text"
            " AND o.holder = :holder AND o.expires_at > now())"
        )
    if fence:
        extra += " AND EXISTS (SELECT 1 FROM fence)"
    return f"""
WITH {_FENCE_CTE if fence else ""}due AS (
    SELECT d.id, d.due_at FROM unnest(CAST(:kinds AS text[])) AS k(kind) CROSS JOIN LATERAL (
        SELECT id, run_at AS due_at FROM {{s}}.work_queue
        WHERE state = 'ready' AND kind = k.kind AND run_at <= {now}{extra}
        ORDER BY run_at, id LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ) AS d
), expired AS (
    SELECT id, claimed_until AS due_at FROM {{s}}.work_queue
    WHERE state = 'claimed' AND claimed_until <= {now} AND kind = ANY(CAST(:kinds AS text[])){extra}
    ORDER BY claimed_until, id LIMIT :limit
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id, due_at FROM (SELECT * FROM due UNION ALL SELECT * FROM expired) AS c
    ORDER BY due_at, id LIMIT :limit
)
UPDATE {{s}}.work_queue AS q SET
    state = 'claimed',
    attempts = q.attempts + 1,
    claim_token = gen_random_uuid()::text,
    claimed_by = :holder,
    claimed_until = {now} + :claim_for,
    payload = COALESCE(q.rerun_payload, q.payload),
    rerun_at = NULL,
    rerun_payload = NULL
FROM picked
WHERE q.id = picked.id
RETURNING q.id, q.kind, q.key, q.shard, q.payload, q.attempts, q.claim_token, q.claimed_until, q.last_error,
    picked.due_at
"""


# The row is locked first so both branches judge the latest rerun_at, even if an enqueue committed a moment ago.
# ``again_after`` (timed form) asks for a rerun of its own, merged with one requested meanwhile.
@functools.cache
def complete_sql(*, fence: bool = False, timed: bool = False) -> str:
    """The complete statement (``{s}`` stands for the schema); ``fence`` adds the lease check, ``timed`` the
    ``:again_after`` and ``:now`` parameters."""
    again = f"LEAST(cur.rerun_at, {_NOW} + CAST(:again_after AS interval))" if timed else "cur.rerun_at"
    return f"""
WITH {_FENCE_CTE if fence else ""}cur AS (
    SELECT id, {again} AS again_at FROM {{s}}.work_queue AS cur
    WHERE id = :id AND claim_token = :token{" AND EXISTS (SELECT 1 FROM fence)" if fence else ""}
    FOR UPDATE
), gone AS (
    DELETE FROM {{s}}.work_queue AS q USING cur WHERE q.id = cur.id AND cur.again_at IS NULL RETURNING q.id
), again AS (
    UPDATE {{s}}.work_queue AS q SET
        state = 'ready', run_at = cur.again_at, payload = COALESCE(q.rerun_payload, q.payload), attempts = 0,
        rerun_at = NULL, rerun_payload = NULL, claim_token = NULL, claimed_by = NULL, claimed_until = NULL,
        last_error = NULL
    FROM cur WHERE q.id = cur.id AND cur.again_at IS NOT NULL
    RETURNING q.id
)
SELECT count(*) AS n FROM cur
"""


# A rerun requested meanwhile merges in: one ready row, due at the earlier of the two times.
@functools.cache
def retry_sql(*, fence: bool) -> str:
    """The retry statement (``{s}`` stands for the schema), with or without the lease check."""
    return f"""
WITH {_FENCE_CTE if fence else ""}go AS (SELECT 1)
UPDATE {{s}}.work_queue SET
    state = 'ready', run_at = LEAST({_NOW} + :delay, rerun_at), payload = COALESCE(rerun_payload, payload),
    rerun_at = NULL, rerun_payload = NULL, claim_token = NULL, claimed_by = NULL, claimed_until = NULL,
    last_error = :error
WHERE id = :id AND claim_token = :token{" AND EXISTS (SELECT 1 FROM fence)" if fence else ""}
"""


_EXTEND = """
UPDATE {s}.work_queue SET claimed_until = now() + :claim_for
WHERE id = :id AND claim_token = :token
RETURNING claimed_until
"""

_PENDING_ALL = "SELECT count(*) AS n FROM {s}.work_queue"
_PENDING_KINDS = "SELECT count(*) AS n FROM {s}.work_queue WHERE kind = ANY(CAST(:kinds AS text[]))"
# Per kind, through the two partial indexes the claim reads (ready by run_at, claimed by claimed_until).
_DEPTH = """
SELECT kind, count(*) AS n FROM (
    SELECT kind FROM {s}.work_queue WHERE state = 'ready' AND kind = ANY(CAST(:kinds AS text[])) AND run_at <= now()
    UNION ALL
    SELECT kind FROM {s}.work_queue
    WHERE state = 'claimed' AND kind = ANY(CAST(:kinds AS text[])) AND claimed_until <= now()
) AS d GROUP BY kind
"""


def _items(items: Sequence[WorkItem]) -> str:
    return dumps(
        [
            {
                "ord": n,
                "kind": item.kind,
                "key": item.key,
                "shard": item.shard,
                "payload": dict(item.payload),
                "run_at": when(item.run_at),
            }
            for n, item in enumerate(items)
        ]
    )


def _fence(lease: Lease | None) -> dict[str, Any]:
    if lease is None:
        return {}
    return {"lease_name": lease.name, "lease_holder": lease.holder, "lease_token": lease.token}


def _claim(row: Any) -> Claim:
    return Claim(
        id=row.id,
        kind=row.kind,
        key=row.key,
        shard=row.shard,
        payload=row.payload,
        attempts=row.attempts,
        token=row.claim_token,
        claimed_until=utc(row.claimed_until),
        last_error=row.last_error,
        due_at=utc(row.due_at),
    )


class PgWorkQueue:
    """``bettercompute.ports.WorkQueue`` on the ``work_queue`` table."""

    def __init__(self, db: Database, on_enqueued: Callable[[frozenset[str]], Awaitable[None]] | None = None) -> None:
        self._db = db
        self._on_enqueued = on_enqueued
        self._enqueue = db.sql(_ENQUEUE)
        self._claims: dict[tuple[bool, bool, bool], Statement] = {
            (shards, fence, owned): db.sql(claim_sql(shards=shards, fence=fence, clock=True, owned=owned))
            for shards in (False, True)
            for fence in (False, True)
            for owned in (False, True)
        }
        self._completes = {fence: db.sql(complete_sql(fence=fence, timed=True)) for fence in (False, True)}
        self._retries = {fence: db.sql(retry_sql(fence=fence)) for fence in (False, True)}
        self._extend = db.sql(_EXTEND)
        self._pending_all = db.sql(_PENDING_ALL)
        self._pending_kinds = db.sql(_PENDING_KINDS)
        self._depth = db.sql(_DEPTH)

    async def enqueue(self, items: Sequence[WorkItem]) -> None:
        """Add work in its own transaction; a key already waiting keeps one item, due at the earlier time."""
        if items:
            await self._db.fetch(self._enqueue, {"items": _items(items)})
            if self._on_enqueued is not None:
                await self._on_enqueued(frozenset(item.kind for item in items))

    async def enqueue_in(self, conn: Connection, items: Sequence[WorkItem]) -> None:
        """Add work in the caller's transaction."""
        if items:
            defer_in(conn, self._enqueue, {"items": _items(items)})

    async def claim(
        self,
        *,
        holder: str,
        kinds: Sequence[str],
        limit: int,
        claim_for: dt.timedelta,
        shards: Sequence[int] | None = None,
        fence: Lease | None = None,
        now: dt.datetime | None = None,
        owner_prefix: str | None = None,
    ) -> list[Claim]:
        """Claim up to ``limit`` items due at ``now`` (expired claims included), oldest first; none if ``fence`` is
        stale; with ``owner_prefix``, only on shards whose lease ``<owner_prefix><shard>`` ``holder`` holds."""
        if limit <= 0 or not kinds or (shards is not None and not shards):
            return []
        params: dict[str, Any] = {
            "holder": holder,
            "kinds": list(kinds),
            "limit": limit,
            "claim_for": claim_for,
            "now": now,
        }
        if shards is not None:
            params["shards"] = list(shards)
        if owner_prefix is not None:
            params["owner_prefix"] = owner_prefix
        params.update(_fence(fence))
        key = (shards is not None, fence is not None, owner_prefix is not None)
        rows = await self._db.fetch(self._claims[key], params)
        return [_claim(row) for row in sorted(rows, key=lambda r: (r.due_at, r.id))]

    async def complete(
        self,
        claim: Claim,
        *,
        fence: Lease | None = None,
        again_after: dt.timedelta | None = None,
        now: dt.datetime | None = None,
    ) -> bool:
        """Remove finished work (or make it, or a rerun requested meanwhile, ready again); ``False`` if the claim
        was lost or ``fence`` is stale."""
        params = {"id": claim.id, "token": claim.token, "again_after": again_after, "now": now, **_fence(fence)}
        rows = await self._db.fetch(self._completes[fence is not None], params)
        return bool(rows[0].n)

    async def retry(
        self,
        claim: Claim,
        *,
        delay: dt.timedelta,
        error: str,
        fence: Lease | None = None,
        now: dt.datetime | None = None,
    ) -> bool:
        """Hand the item back, due after ``delay``; ``False`` if the claim was lost or ``fence`` is stale."""
        params = {"id": claim.id, "token": claim.token, "delay": delay, "error": error, "now": now, **_fence(fence)}
        return await self._db.rowcount(self._retries[fence is not None], params) == 1

    async def extend(self, claim: Claim, claim_for: dt.timedelta) -> Claim | None:
        """Push the claim's expiry to ``claim_for`` from now; ``None`` if it was lost."""
        rows = await self._db.fetch(self._extend, {"id": claim.id, "token": claim.token, "claim_for": claim_for})
        return attrs.evolve(claim, claimed_until=utc(rows[0].claimed_until)) if rows else None

    async def pending(self, kinds: Sequence[str] | None = None) -> int:
        """How many items wait or run."""
        if kinds is None:
            rows = await self._db.fetch(self._pending_all, {})
        else:
            rows = await self._db.fetch(self._pending_kinds, {"kinds": list(kinds)})
        return int(rows[0].n)

    async def depth(self, kinds: Sequence[str]) -> dict[str, int]:
        """Per kind, the items due and not running (ready and due, or claimed and run out)."""
        if not kinds:
            return {}
        rows = await self._db.fetch(self._depth, {"kinds": list(kinds)})
        return {str(row.kind): int(row.n) for row in rows}
