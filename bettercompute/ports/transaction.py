"""One database transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar, runtime_checkable

from bettercompute.ports.audit import AuditRecord
from bettercompute.ports.iam import ResourceRef
from bettercompute.ports.outbox import OutboxEvent
from bettercompute.ports.queue import WorkItem
from bettercompute.ports.repository import Repository

__all__ = ["Transaction"]

R = TypeVar("R")


@runtime_checkable
class Transaction(Protocol):
    """One database transaction; what is written through it commits or rolls back together.

    Repositories are reached through it, never handed it: ``tx.repository(POOLS).create(...)``.
    """

    def repository(self, key: Repository[R]) -> R:
        """The store's repository for ``key``, bound to this transaction: its reads see the transaction's own
        uncommitted writes, its writes commit or roll back with the transaction, and its locks are held until the
        transaction ends. Asking twice in one transaction gives the same object; use it only inside the
        ``async with`` block that opened the transaction. Outside a transaction use ``store.repository(key)``.

        Raises:
            InvalidConfigError: the store has no repository of that module and name.
        """
        ...

    async def enqueue(self, items: Sequence[WorkItem]) -> None:
        """Add work that becomes visible when the transaction commits."""
        ...

    async def publish(self, events: Sequence[OutboxEvent]) -> None:
        """Add outbox events that become visible when the transaction commits."""
        ...

    async def audit(self, record: AuditRecord) -> None:
        """Add an audit row."""
        ...

    async def project(self, resource: ResourceRef, *, owner: str | None = None) -> None:
        """Record in the authorization projection which tenant (and pool, and owner) a resource belongs to.

        ``resource.id`` and ``resource.tenant`` are required. Write it in the transaction that creates the resource
        (tx 1 of admission), so that decisions on the resource by id see its tenant.
        """
        ...

    async def unproject(self, resource_type: str, resource_id: str) -> None:
        """Remove a resource from the authorization projection."""
        ...

    async def tenant_exists(self, tenant: str) -> bool:
        """Whether ``tenant`` is a tenant the IAM knows, read in this transaction.

        A handler that creates a resource in a tenant asks this in the transaction that inserts it and raises
        ``NotFoundError`` when it is ``False``, so no row is written for a tenant that does not exist. A tenant found
        stays locked against deletion until the transaction ends.
        """
        ...
