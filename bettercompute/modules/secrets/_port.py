"""Secrets at rest, sealed by the KMS."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository, Sealed

__all__ = ["SEALED_SECRETS", "SECRETS", "SecretRecord", "SecretStore"]


@attrs.frozen(kw_only=True, repr=False)
class SecretRecord:
    """A secret of the ``secrets`` group as stored: ``sealed_value`` is what the KMS made of the value (context
    ``secret:<tenant>:<name>``), never the value itself. ``scope`` is ``node:<id>``, ``pool:<id>`` or ``site:<id>``.
    Its ``repr`` leaves the sealed value out."""

    id: str
    tenant: str
    name: str
    scope: str
    description: str
    sealed_value: bytes
    created_at: dt.datetime

    def __repr__(self) -> str:
        return f"SecretRecord(id={self.id!r}, tenant={self.tenant!r}, name={self.name!r}, scope={self.scope!r})"


class SecretStore(Protocol):
    """Secrets of the ``secrets`` group, sealed by the KMS; a name is unique within its tenant. Writes need a
    transaction (``tx.repository(SECRETS)``)."""

    async def create(self, record: SecretRecord) -> SecretRecord:
        """Add a secret (``created_at`` is the store's now). ``ConflictError`` if the tenant has one of that name."""
        ...

    async def for_tenant(self, tenant: str, *, after: Sequence[Any] | None, limit: int) -> list[SecretRecord]:
        """The tenant's secrets by name (unique in a tenant): at most ``limit``, after the key ``after`` (a name)."""
        ...

    async def delete(self, *, tenant: str, name: str) -> SecretRecord | None:
        """Delete a secret of ``tenant``; ``None`` when it has no such one."""
        ...

    async def named(self, name: str, *, scopes: Sequence[str], tenant: str | None = None) -> list[SecretRecord]:
        """The secrets called ``name`` whose scope is one of ``scopes`` (of ``tenant`` only, when given)."""
        ...


SECRETS: Repository[SecretStore] = Repository(module="secrets", name="secrets")
"""``tx.repository(SECRETS)`` in a transaction, ``store.repository(SECRETS)`` outside one: the store's
``SecretStore``"""
SEALED_SECRETS: Repository[Sealed] = Repository(module="secrets", name="sealed_secrets")
"""Every secret's value (``secrets.sealed_value``)."""
