"""Pools of machines: what the ``pools`` group keeps."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository

__all__ = [
    "POOLS",
    "PoolRecord",
    "Pools",
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


POOLS: Repository[Pools] = Repository(module="pools", name="pools")
"""``tx.repository(POOLS)`` in a transaction, ``store.repository(POOLS)`` outside one: the store's ``Pools``"""
