"""The audit log as the ``audit`` module reads it: the rows every mutation writes (``Transaction.audit``), and the
hash chain the ``audit-chain`` job links them into."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository

__all__ = ["AUDIT_LOG", "AuditFilter", "AuditLog", "AuditRow", "ChainLink", "Position"]

Position = tuple[int, int]
"""Where a row stands in linking order: (the id of the transaction that wrote it, its id)."""


@attrs.frozen(kw_only=True)
class AuditRow:
    """A stored audit row, with its link when it has one (``chain_seq``, ``hash``) and its linking ``position``."""

    id: int
    at: dt.datetime
    action: str
    actor: str
    tenant: str | None
    resource_type: str
    resource_id: str | None
    decision_id: str | None
    outcome: str
    details: Mapping[str, Any]
    position: Position
    chain_seq: int | None = None
    hash: bytes | None = None


@attrs.frozen(kw_only=True)
class AuditFilter:
    """Which rows ``AuditLog.rows`` returns: of ``tenant`` (``None``: any), and every other field that is set."""

    tenant: str | None = None
    actor: str | None = None
    action: str | None = None
    resource_type: str | None = None
    resource_id: str | None = None
    since: dt.datetime | None = None
    until: dt.datetime | None = None


@attrs.frozen(kw_only=True)
class ChainLink:
    """One link of a chain: row ``audit_id`` is number ``seq`` of chain ``chain`` (its tenant, ``""`` for none), and
    ``hash`` is SHA-256 over the previous link's hash and the row (``bettercompute.modules.audit.link_hash``).
    ``row`` is the linked row as it is now, ``None`` if it is gone."""

    chain: str
    seq: int
    audit_id: int
    hash: bytes
    position: Position
    row: AuditRow | None = None


class AuditLog(Protocol):
    """The audit rows and their chains. Neither is ever updated or deleted (the store refuses it); ``link`` needs a
    transaction (``tx.repository(AUDIT_LOG)``), the one fenced by the ``audit-chain`` job's lease."""

    async def rows(self, where: AuditFilter, *, after: int | None, limit: int) -> list[AuditRow]:
        """At most ``limit`` rows matching ``where`` with an id above ``after``, by id."""
        ...

    async def get(self, audit_id: int) -> AuditRow | None:
        """A row by id."""
        ...

    async def linked_until(self) -> Position | None:
        """The position of the last row linked, ``None`` before the first."""
        ...

    async def linkable(self, *, after: Position | None, limit: int) -> list[AuditRow]:
        """At most ``limit`` rows past ``after`` whose transactions have all ended (so no row can ever appear
        before them), in linking order (by position)."""
        ...

    async def unlinked(self, *, after: Position | None) -> int:
        """How many rows stand past ``after`` (written and not linked yet)."""
        ...

    async def heads(self, chains: Sequence[str]) -> dict[str, tuple[int, bytes]]:
        """The newest link (``seq``, ``hash``) of each of ``chains`` that has one."""
        ...

    async def link(self, links: Sequence[ChainLink]) -> None:
        """Record these links (in a transaction)."""
        ...

    async def chains(self) -> list[str]:
        """Every chain that has a link, by name."""
        ...

    async def walk(self, chain: str, *, after_seq: int, limit: int) -> list[ChainLink]:
        """At most ``limit`` links of ``chain`` after ``after_seq``, by ``seq``, each with its row as it is now."""
        ...


AUDIT_LOG: Repository[AuditLog] = Repository(module="audit", name="log")
"""``store.repository(AUDIT_LOG)``, or ``tx.repository(AUDIT_LOG)`` in a transaction: the store's ``AuditLog``."""
