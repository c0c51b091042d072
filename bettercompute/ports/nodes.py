"""Nodes and JoinService's keys."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports.transaction import Transaction

__all__ = ["Enrollment", "JoinKeyRecord", "JoinKeys", "NodeRecord", "Nodes"]


@attrs.frozen(kw_only=True)
class NodeRecord:
    """A machine joined to a pool. ``state`` is ``adopting`` (joined, acceptance checks pending), ``adopted``,
    ``failed`` or ``retired``. ``hardware_key`` is derived from its stable hardware claims; ``claims`` are the
    hardware claims of its latest join and ``attestation`` the facts the attestor chain recorded then.
    ``enrollments`` counts its joins (1 + reclaims)."""

    id: str
    tenant: str
    pool_id: str
    site_id: str | None
    state: str
    hardware_key: str
    claims: Mapping[str, Any]
    attestation: Mapping[str, Any]
    join_token_id: str | None
    enrollments: int
    session_epoch: int
    desired_generation: int
    observed_generation: int
    last_seen_at: dt.datetime | None
    joined_at: dt.datetime
    created_at: dt.datetime
    updated_at: dt.datetime
    retired_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class Enrollment:
    """What ``Nodes.enroll`` did: ``created`` a node, ``reclaimed`` the pool's live node with the same hardware key,
    or found such a node while reclaiming was not allowed (``conflict``; ``node`` is that node, nothing written)."""

    outcome: str
    node: NodeRecord


@attrs.frozen(kw_only=True, repr=False)
class JoinKeyRecord:
    """JoinService's X25519 key: ``sealed_key`` is the 32-byte private key as the KMS sealed it (context
    ``join-key:<id>``); ``public_key`` its base64url text. ``state`` is ``active`` (one) or ``previous``."""

    id: str
    public_key: str
    sealed_key: bytes
    state: str
    created_at: dt.datetime

    def __repr__(self) -> str:
        return f"JoinKeyRecord(id={self.id!r}, state={self.state!r})"


class Nodes(Protocol):
    """Nodes (machines joined to pools). Writes given a ``tx`` commit with it."""

    async def enroll(
        self,
        tx: Transaction,
        *,
        new_id: str,
        pool_id: str,
        tenant: str,
        hardware_key: str,
        claims: Mapping[str, Any],
        attestation: Mapping[str, Any],
        join_token_id: str,
        reclaim: bool,
    ) -> Enrollment:
        """Insert node ``new_id`` as ``adopting``, unless the pool has a live (not retired) node with this hardware
        key: with ``reclaim`` that node is taken back (``adopting`` again, new claims, ``enrollments`` + 1), without
        it the answer is ``conflict`` and nothing is written. Of two concurrent enrollments of one new hardware key,
        one creates the node and the other gets ``ConflictError``."""
        ...

    async def get(self, id: str, *, tx: Transaction | None = None, lock: bool = False) -> NodeRecord | None:
        """A node by id; with ``lock`` (and ``tx``) its row is share-locked until ``tx`` ends, so a reclaim or a
        retirement of it waits (or is waited for)."""
        ...

    async def for_pool(self, pool_id: str) -> list[NodeRecord]:
        """The pool's nodes, oldest first."""
        ...

    async def for_tenant(
        self, tenant: str, *, pool_id: str | None = None, after: Sequence[Any] | None, limit: int
    ) -> list[NodeRecord]:
        """The tenant's nodes (of one pool when ``pool_id`` is given) in ``(created_at, id)`` order: at most
        ``limit``, after the key ``after``."""
        ...

    async def retire(self, tx: Transaction, id: str) -> NodeRecord | None:
        """Retire a node for good (idempotent): it can no longer renew, fetch secrets or be reclaimed; ``None`` for
        no such node."""
        ...


class JoinKeys(Protocol):
    """JoinService's key pairs (sealed by the KMS)."""

    async def active(self) -> JoinKeyRecord | None:
        """The active key, if one was made."""
        ...

    async def create_if_none(self, *, id: str, public_key: str, sealed_key: bytes) -> JoinKeyRecord:
        """Add this key as the active one unless there is an active key already; returns the active key (so of
        several processes starting at once, all end up with the one that was stored first)."""
        ...
