"""Join tokens (``JoinTokens``).

A join token row holds the SHA-256 of its secret only, never the secret. ``consume`` spends a use in one statement:
the row is locked, and the decrement's own conditions (secret hash, not revoked, not expired, a use left) are
checked again on the row's latest version, so of two joins racing for the last use exactly one gets it.
"""

from __future__ import annotations

import datetime as dt
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

from bettercompute.modules.nodes import JoinTokenMatch, JoinTokenRecord, TokenConsumption
from bettercompute_store_pg._db import Database, dumps, utc
from bettercompute_store_pg._repository import PgRepository
from bettercompute_store_pg.modules.pools import POOL_COLUMNS, pool_record

__all__ = ["PgJoinTokens"]


_TOKEN_COLUMNS = "id, pool_id, tenant, uses, uses_left, expires_at, expect, reclaim, created_by, created_at, revoked_at, last_used_at"  # noqa: S105, E501
_TOKEN_CREATE = f"""
INSERT INTO {{s}}.join_tokens (id, pool_id, tenant, secret_hash, uses, uses_left, expires_at, expect, reclaim,
    created_by)
VALUES (:id, :pool_id, :tenant, :secret_hash, :uses, :uses, :expires_at, CAST(:expect AS jsonb), :reclaim,
    :created_by)
RETURNING {_TOKEN_COLUMNS}
"""
_TOKEN_LIST = f"""
SELECT {_TOKEN_COLUMNS} FROM {{s}}.join_tokens
WHERE pool_id = :pool_id AND (CAST(:after_at AS timestamptz) IS NULL OR (created_at, id) < (:after_at, :after_id))
ORDER BY created_at DESC, id DESC LIMIT :limit
"""
_TOKEN_GET = f"SELECT {_TOKEN_COLUMNS} FROM {{s}}.join_tokens WHERE id = :id"


# The token and its pool in one round trip (a join needs both before anything else): the pool's columns prefixed
# (its id is the token's pool_id).
_TOKEN_MATCHING = f"""
SELECT {", ".join(f"t.{c}" for c in _TOKEN_COLUMNS.split(", "))},
    {", ".join(f"p.{c} AS pool_{c}" for c in POOL_COLUMNS.split(", ") if c != "id")}
FROM {{s}}.join_tokens AS t JOIN {{s}}.pools AS p ON p.id = t.pool_id
WHERE t.id = :id AND t.secret_hash = :secret_hash
"""
_TOKEN_REVOKE = f"""
UPDATE {{s}}.join_tokens SET revoked_at = coalesce(revoked_at, now()) WHERE id = :id RETURNING {_TOKEN_COLUMNS}
"""


# One statement: lock the row, spend a use if every condition holds on its latest version, and report the row as
# it was before (so the caller can say why nothing was spent) with the uses left after, if one was spent.
_TOKEN_CONSUME = f"""
WITH t AS (SELECT {_TOKEN_COLUMNS}, secret_hash FROM {{s}}.join_tokens WHERE id = :id FOR UPDATE),
spent AS (
    UPDATE {{s}}.join_tokens AS j SET uses_left = j.uses_left - 1, last_used_at = :now
    FROM t
    WHERE j.id = t.id AND j.secret_hash = :secret_hash AND j.revoked_at IS NULL AND j.expires_at > :now
      AND j.uses_left > 0
    RETURNING j.uses_left
)
SELECT t.*, (SELECT uses_left FROM spent) AS uses_after FROM t
"""


def _token(row: Any, *, uses_left: int | None = None) -> JoinTokenRecord:
    return JoinTokenRecord(
        id=row.id,
        pool_id=row.pool_id,
        tenant=row.tenant,
        uses=row.uses,
        uses_left=row.uses_left if uses_left is None else uses_left,
        expires_at=utc(row.expires_at),
        expect=dict(row.expect),
        reclaim=row.reclaim,
        created_by=row.created_by,
        created_at=utc(row.created_at),
        revoked_at=utc(row.revoked_at) if row.revoked_at is not None else None,
        last_used_at=utc(row.last_used_at) if row.last_used_at is not None else None,
    )


class PgJoinTokens(PgRepository):
    """``JoinTokens`` on the ``join_tokens`` table; one statement per call."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._create = db.sql(_TOKEN_CREATE)
        self._list = db.sql(_TOKEN_LIST)
        self._get = db.sql(_TOKEN_GET)
        self._matching = db.sql(_TOKEN_MATCHING)
        self._revoke = db.sql(_TOKEN_REVOKE)
        self._consume = db.sql(_TOKEN_CONSUME)

    async def create(
        self,
        *,
        id: str,
        pool_id: str,
        tenant: str,
        secret_hash: bytes,
        uses: int,
        expires_at: dt.datetime,
        expect: Mapping[str, Any],
        reclaim: str,
        created_by: str | None,
    ) -> JoinTokenRecord:
        """Add a token in the caller's transaction (only the secret's hash is given, and stored)."""
        params = {
            "id": id,
            "pool_id": pool_id,
            "tenant": tenant,
            "secret_hash": secret_hash,
            "uses": uses,
            "expires_at": expires_at,
            "expect": dumps(dict(expect)),
            "reclaim": reclaim,
            "created_by": created_by,
        }
        rows = await self._fetch_in_transaction("create", self._create, params)
        return _token(rows[0])

    async def for_pool(self, pool_id: str, *, after: Sequence[Any] | None, limit: int) -> list[JoinTokenRecord]:
        """The pool's tokens, newest first, before ``after``."""
        after_at, after_id = after if after is not None else (None, None)
        params = {"pool_id": pool_id, "after_at": after_at, "after_id": after_id, "limit": limit}
        rows = await self._fetch(self._list, params)
        return [_token(row) for row in rows]

    async def get(self, id: str) -> JoinTokenRecord | None:
        """A token by id."""
        rows = await self._fetch(self._get, {"id": id})
        return _token(rows[0]) if rows else None

    async def matching(self, id: str, *, secret_hash: bytes) -> JoinTokenMatch | None:
        """The token ``id`` and its pool if the token's stored hash is ``secret_hash``, in one statement."""
        rows = await self._fetch(self._matching, {"id": id, "secret_hash": secret_hash})
        if not rows:
            return None
        row = rows[0]
        # The pool's id is the token's ``pool_id``: with the prefix, ``id`` reads that column.
        return JoinTokenMatch(token=_token(row), pool=pool_record(row, prefix="pool_"))

    async def revoke(self, id: str) -> JoinTokenRecord | None:
        """End a token now (a revoked one keeps its first ``revoked_at``); ``None`` when there is no such token."""
        rows = await self._fetch_in_transaction("revoke", self._revoke, {"id": id})
        return _token(rows[0]) if rows else None

    async def consume(self, *, id: str, secret_hash: bytes, now: dt.datetime) -> TokenConsumption:
        """Spend one use of a token in the caller's transaction (rolled back with it), in one statement.

        The outcome is ``consumed`` (``token.uses_left`` is what is left after), or why nothing was spent:
        ``unknown`` (no such token, or a secret that does not match it: report both alike), ``revoked``,
        ``expired`` (at ``now``) or ``exhausted``. The hash is compared in SQL, to make the decrement conditional
        on it; the result is re-checked here with ``hmac.compare_digest``.
        """
        rows = await self._fetch_in_transaction(
            "consume", self._consume, {"id": id, "secret_hash": secret_hash, "now": now}
        )
        if not rows:
            return TokenConsumption(outcome="unknown", token=None)
        row = rows[0]
        if not hmac.compare_digest(bytes(row.secret_hash), secret_hash):
            return TokenConsumption(outcome="unknown", token=None)
        if row.uses_after is not None:
            return TokenConsumption(outcome="consumed", token=_token(row, uses_left=row.uses_after))
        token = _token(row)
        if token.revoked_at is not None:
            outcome = "revoked"
        elif token.expires_at <= now:
            outcome = "expired"
        else:
            outcome = "exhausted"
        return TokenConsumption(outcome=outcome, token=token)
