"""Pools and their join tokens."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository

__all__ = [
    "JOIN_TOKENS",
    "POOLS",
    "JoinTokenMatch",
    "JoinTokenRecord",
    "JoinTokens",
    "PoolRecord",
    "Pools",
    "TokenConsumption",
]


@attrs.frozen(kw_only=True)
class PoolRecord:
    """A stored pool: ``pool_class`` is ``gpu``, ``vps-host`` or ``provider``."""

    id: str
    tenant: str
    name: str
    pool_class: str
    acceptance_checks: tuple[str, ...]
    labels: Mapping[str, str]
    node_policy: Mapping[str, Any]
    """The pool's ``NodePolicy`` as stored (``NodePolicy.from_stored`` reads it)."""
    created_at: dt.datetime
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class JoinTokenRecord:
    """A stored join token, without its secret or its hash. ``expect`` holds only the claims to check."""

    id: str
    pool_id: str
    tenant: str
    uses: int
    uses_left: int
    expires_at: dt.datetime
    expect: Mapping[str, Any]
    reclaim: str
    created_by: str | None
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class JoinTokenMatch:
    """A join token found by its id and secret, with its pool (``JoinTokens.matching``: a join reads both at once)."""

    token: JoinTokenRecord
    pool: PoolRecord


@attrs.frozen(kw_only=True)
class TokenConsumption:
    """What ``JoinTokens.consume`` did: ``consumed`` (``token.uses_left`` is what is left), or why not:
    ``unknown`` (no such token or a wrong secret; ``token`` is ``None``), ``revoked``, ``expired``, ``exhausted``."""

    outcome: str
    token: JoinTokenRecord | None


class Pools(Protocol):
    """Pools of machines (the ``pools`` group's state). Writes need a transaction (``tx.repository(POOLS)``)."""

    async def create(
        self,
        *,
        id: str,
        tenant: str,
        name: str,
        pool_class: str,
        acceptance_checks: Sequence[str],
        labels: Mapping[str, str],
        node_policy: Mapping[str, Any] | None = None,
    ) -> PoolRecord:
        """Add a pool. ``ConflictError`` when the tenant has a pool of that name."""
        ...

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[PoolRecord]:
        """The tenant's pools in ``(created_at, id)`` order (a name can change): at most ``limit``, after the key
        ``after``."""
        ...

    async def get(self, id: str) -> PoolRecord | None:
        """A pool by id."""
        ...

    async def update(
        self,
        *,
        id: str,
        name: str | None = None,
        acceptance_checks: Sequence[str] | None = None,
        labels: Mapping[str, str] | None = None,
        node_policy: Mapping[str, Any] | None = None,
    ) -> PoolRecord | None:
        """Change the given fields; ``None`` for no such pool, ``ConflictError`` when the new name is taken."""
        ...


class JoinTokens(Protocol):
    """Join tokens of pools: only the SHA-256 of a token's secret is ever given to the store. ``create``, ``revoke``
    and ``consume`` need a transaction (``tx.repository(JOIN_TOKENS)``)."""

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
        """Add a token with ``uses`` uses left."""
        ...

    async def for_pool(self, pool_id: str, *, after: Sequence[Any] | None, limit: int) -> list[JoinTokenRecord]:
        """The pool's tokens, newest first (``(created_at, id)`` descending): at most ``limit``, before the key
        ``after``."""
        ...

    async def get(self, id: str) -> JoinTokenRecord | None:
        """A token by id."""
        ...

    async def matching(self, id: str, *, secret_hash: bytes) -> JoinTokenMatch | None:
        """The token ``id`` and its pool if its secret hashes to ``secret_hash`` (whatever its state), else
        ``None``."""
        ...

    async def revoke(self, id: str) -> JoinTokenRecord | None:
        """End a token (idempotent); ``None`` for no such token."""
        ...

    async def consume(self, *, id: str, secret_hash: bytes, now: dt.datetime) -> TokenConsumption:
        """Spend one use atomically if the hash matches and the token is live at ``now``: of concurrent consumers
        of the last use, exactly one gets ``consumed``."""
        ...


POOLS: Repository[Pools] = Repository(module="pools", name="pools")
"""``tx.repository(POOLS)`` in a transaction, ``store.repository(POOLS)`` outside one: the store's ``Pools``"""
JOIN_TOKENS: Repository[JoinTokens] = Repository(module="pools", name="join_tokens")
"""``tx.repository(JOIN_TOKENS)`` in a transaction, ``store.repository(JOIN_TOKENS)`` outside one: the store's
``JoinTokens``"""
