"""Leases with fencing tokens; each call is one statement."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection
from typing import Any

from bettercompute.errors import FailedPreconditionError
from bettercompute.ports import Lease

from ._db import Connection, Database, dumps, fetch_in, utc

__all__ = ["PgLeases"]

_COLUMNS = "name, holder, token, expires_at"

# The token grows whenever the lease was not live in this holder's hands (taken over, expired, or released), so an
# old Lease object never becomes valid again.
# Fenced transactions hold their lease row FOR KEY SHARE: renewals (plain UPDATEs of expires_at) pass it, while a
# takeover locks the row FOR UPDATE, which that share lock refuses. A takeover SKIPS such a row (SKIP LOCKED) rather
# than wait for it: the holder's fenced transaction ends first (committing before the takeover, or rolled back), and
# the lease is taken on a later try. Waiting would hand the holder's stall to the taker: a holder stopped inside a
# fenced transaction (SIGSTOP, a long GC pause, a partition) would stop every worker's shard cycle behind it, and
# their own leases would then run out too (found by tests/reliability).
# Only rows locked here, or names without a row yet, are written, so the upsert never waits on a skipped row.
_ACQUIRE = """
WITH locked AS (SELECT name FROM {s}.leases WHERE name = :name FOR UPDATE SKIP LOCKED)
INSERT INTO {s}.leases AS l (name, holder, token, expires_at)
SELECT :name, :holder, 1, now() + :ttl
WHERE EXISTS (SELECT 1 FROM locked) OR NOT EXISTS (SELECT 1 FROM {s}.leases WHERE name = :name)
ON CONFLICT (name) DO UPDATE SET
    holder = EXCLUDED.holder,
    token = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now() THEN l.token ELSE l.token + 1 END,
    expires_at = EXCLUDED.expires_at
WHERE l.holder = EXCLUDED.holder OR l.expires_at <= now()
RETURNING name, holder, token, expires_at
"""

_RENEW = """
UPDATE {s}.leases SET expires_at = now() + :ttl
WHERE name = :name AND holder = :holder AND token = :token AND expires_at > now()
RETURNING name, holder, token, expires_at
"""

# Released leases keep their row so the next holder's token is still higher.
_RELEASE = """
UPDATE {s}.leases SET expires_at = now()
WHERE name = :name AND holder = :holder AND token = :token AND expires_at > now()
"""

# The batch forms lock rows in name order, so two workers trading shards never wait for each other in a cycle.
_ACQUIRE_MANY = """
WITH locked AS (
    SELECT name FROM {s}.leases WHERE name = ANY(CAST(:names AS text[])) ORDER BY name FOR UPDATE SKIP LOCKED
)
INSERT INTO {s}.leases AS l (name, holder, token, expires_at)
SELECT n.name, :holder, 1, now() + :ttl FROM unnest(CAST(:names AS text[])) WITH ORDINALITY AS n(name, ord)
WHERE n.name IN (SELECT name FROM locked) OR NOT EXISTS (SELECT 1 FROM {s}.leases AS e WHERE e.name = n.name)
ORDER BY n.ord
ON CONFLICT (name) DO UPDATE SET
    holder = EXCLUDED.holder,
    token = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now() THEN l.token ELSE l.token + 1 END,
    expires_at = EXCLUDED.expires_at
WHERE l.holder = EXCLUDED.holder OR l.expires_at <= now()
RETURNING name, holder, token, expires_at
"""

_HELD = """held AS (
    SELECT l.name FROM {s}.leases AS l
    JOIN jsonb_to_recordset(CAST(:leases AS jsonb)) AS k(name text, holder text, token bigint)
        ON l.name = k.name AND l.holder = k.holder AND l.token = k.token
    WHERE l.expires_at > now()
    ORDER BY l.name
    FOR NO KEY UPDATE OF l
)"""

_RENEW_MANY = f"""
WITH {_HELD}
UPDATE {{s}}.leases AS l SET expires_at = now() + :ttl FROM held WHERE l.name = held.name
RETURNING l.name, l.holder, l.token, l.expires_at
"""

_RELEASE_MANY = f"""
WITH {_HELD}
UPDATE {{s}}.leases AS l SET expires_at = now() FROM held WHERE l.name = held.name
"""

_GET = "SELECT name, holder, token, expires_at FROM {s}.leases WHERE name = :name AND expires_at > now()"

# FOR KEY SHARE: a takeover (acquire locks FOR UPDATE) cannot take the lease while the fenced transaction runs; a
# renewal by the holder is not held up. A holder stopped inside its fenced transaction therefore keeps its lease row
# until the transaction ends: when it resumes, or when the server ends it (``idle_in_transaction_session_timeout``,
# or ``transaction_timeout``: docs/operations.md), which rolls its writes back. Meanwhile takers skip that row
# (``_ACQUIRE``). The statement also bounds how long the transaction's later statements wait for a row lock
# (``lock_timeout``, for this transaction only): a fenced pass that waits longer fails and is retried, instead of
# queueing behind a stalled holder. That matters twice: the stalled holder's own queued passes (waiting on each
# other's rows) would otherwise be cut one idle limit after another, keeping their shards for as many limits; and
# every other worker's passes would pile up behind it.
_FENCE = """
SELECT set_config('lock_timeout', :lock_timeout, true) FROM {s}.leases
WHERE name = :name AND holder = :holder AND token = :token AND expires_at > now()
FOR KEY SHARE
"""

FENCED_LOCK_TIMEOUT = dt.timedelta(seconds=2)
"""How long a statement of a fenced transaction waits for a row lock before it fails (``UNAVAILABLE``, retried)."""
_LOCK_TIMEOUT_MS = str(int(FENCED_LOCK_TIMEOUT.total_seconds() * 1000))


def _lease(row: Any) -> Lease:
    return Lease(name=row.name, holder=row.holder, token=row.token, expires_at=utc(row.expires_at))


def _key(lease: Lease) -> dict[str, Any]:
    return {"name": lease.name, "holder": lease.holder, "token": lease.token}


def _keys(leases: Collection[Lease]) -> str:
    return dumps([_key(lease) for lease in leases])


class PgLeases:
    """``bettercompute.ports.Leases`` on the ``leases`` table."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._acquire = db.sql(_ACQUIRE)
        self._renew = db.sql(_RENEW)
        self._release = db.sql(_RELEASE)
        self._get = db.sql(_GET)
        self._fence = db.sql(_FENCE)
        self._acquire_many = db.sql(_ACQUIRE_MANY)
        self._renew_many = db.sql(_RENEW_MANY)
        self._release_many = db.sql(_RELEASE_MANY)

    async def acquire(self, name: str, holder: str, ttl: dt.timedelta) -> Lease | None:
        """Take the lease if free, expired or already ``holder``'s; ``None`` when someone else holds it."""
        rows = await self._db.fetch(self._acquire, {"name": name, "holder": holder, "ttl": ttl})
        return _lease(rows[0]) if rows else None

    async def renew(self, lease: Lease, ttl: dt.timedelta) -> Lease | None:
        """Extend a lease still held with this token; ``None`` when it was lost."""
        rows = await self._db.fetch(self._renew, {**_key(lease), "ttl": ttl})
        return _lease(rows[0]) if rows else None

    async def release(self, lease: Lease) -> bool:
        """Give the lease back now; ``False`` when it was no longer held."""
        return await self._db.rowcount(self._release, _key(lease)) == 1

    async def get(self, name: str) -> Lease | None:
        """The lease's unexpired state, or ``None``."""
        rows = await self._db.fetch(self._get, {"name": name})
        return _lease(rows[0]) if rows else None

    async def acquire_many(self, names: Collection[str], holder: str, ttl: dt.timedelta) -> list[Lease]:
        """Take every lease of ``names`` that is free, expired or ``holder``'s, in one statement; those taken."""
        if not names:
            return []
        rows = await self._db.fetch(self._acquire_many, {"names": sorted(set(names)), "holder": holder, "ttl": ttl})
        return sorted((_lease(row) for row in rows), key=lambda lease: lease.name)

    async def renew_many(self, leases: Collection[Lease], ttl: dt.timedelta) -> list[Lease]:
        """Extend every lease still held with its token, in one statement; those extended."""
        if not leases:
            return []
        rows = await self._db.fetch(self._renew_many, {"leases": _keys(leases), "ttl": ttl})
        return sorted((_lease(row) for row in rows), key=lambda lease: lease.name)

    async def release_many(self, leases: Collection[Lease]) -> int:
        """Give back every lease still held with its token, in one statement; how many were."""
        if not leases:
            return 0
        return await self._db.rowcount(self._release_many, {"leases": _keys(leases)})

    async def check_fence(self, conn: Connection, lease: Lease) -> None:
        """Lock ``lease``'s row until ``conn``'s transaction ends, or refuse if it is no longer held with its token.

        Raises:
            FailedPreconditionError: The lease expired, was released, or moved to another holder or token.
        """
        if not await fetch_in(conn, self._fence, {**_key(lease), "lock_timeout": _LOCK_TIMEOUT_MS}):
            raise FailedPreconditionError("the lease is no longer held", details={"lease": lease.name})
