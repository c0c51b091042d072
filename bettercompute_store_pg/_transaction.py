"""``PgTransaction``, and ``connection_of``: the one way from a port-typed transaction to its connection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from bettercompute.errors import InternalError
from bettercompute.ports import AuditRecord, OutboxEvent, ResourceRef, Transaction, WorkItem

from ._db import Connection, defer_in, dumps, fetch_in

if TYPE_CHECKING:
    from ._store import PgStore

__all__ = ["PgTransaction", "connection_of"]


def connection_of(tx: Transaction) -> Connection:
    """The psycopg connection of a transaction of the PostgreSQL store, to run statements in it (``fetch_in``).

    Raises:
        InternalError: ``tx`` is another store's transaction (a composition error: PostgreSQL repositories and
            adapters work only with ``PgStore``).
    """
    if not isinstance(tx, PgTransaction):
        raise InternalError("this needs a transaction of the PostgreSQL store")
    return tx.connection


class PgTransaction:
    """One transaction (``bettercompute.ports.Transaction``).

    ``connection`` is the transaction's psycopg ``AsyncConnection`` (in autocommit, inside an explicit BEGIN), for
    the repositories and for PostgreSQL adapters of other packages that write their own tables in the same
    transaction; ``connection_of(tx)`` gets it from a port-typed transaction. Do not commit, roll back or change
    its settings yourself.
    """

    def __init__(self, store: PgStore, connection: Connection) -> None:
        self._store = store
        self.connection = connection
        self.enqueued: set[str] = set()
        self.published = False

    async def enqueue(self, items: Sequence[WorkItem]) -> None:
        """Add work that becomes visible when the transaction commits."""
        await self._store.queue.enqueue_in(self.connection, items)
        self.enqueued.update(item.kind for item in items)

    async def publish(self, events: Sequence[OutboxEvent]) -> None:
        """Add outbox events that become visible, numbered per key, when the transaction commits.

        Each key's counter stays locked until the transaction ends (that is what makes the numbers follow commit
        order): publish a transaction's events in one call, or in the same key order everywhere, so that two
        transactions never wait for each other's keys in opposite orders (PostgreSQL would abort one of them with
        a deadlock, reported as a retryable ``UnavailableError``).
        """
        await self._store.outbox.publish_in(self.connection, events)
        self.published = self.published or bool(events)

    async def audit(self, record: AuditRecord) -> None:
        """Add an audit row."""
        params: dict[str, Any] = {
            "action": record.action,
            "actor": record.actor,
            "tenant": record.tenant,
            "resource_type": record.resource_type,
            "resource_id": record.resource_id,
            "decision_id": record.decision_id,
            "outcome": record.outcome,
            "details": dumps(dict(record.details)),
        }
        defer_in(self.connection, self._store._audit, params)

    async def project(self, resource: ResourceRef, *, owner: str | None = None) -> None:
        """Record (or update) which tenant, pool and owner a resource belongs to."""
        if resource.id is None or resource.tenant is None:
            raise InternalError("a projected resource needs an id and a tenant")
        params = {
            "type": resource.type,
            "id": resource.id,
            "tenant": resource.tenant,
            "pool": resource.pool,
            "owner": owner,
        }
        defer_in(self.connection, self._store._project, params)

    async def unproject(self, resource_type: str, resource_id: str) -> None:
        """Forget a deleted resource."""
        defer_in(self.connection, self._store._unproject, {"type": resource_type, "id": resource_id})

    async def tenant_exists(self, tenant: str) -> bool:
        """Whether the IAM knows ``tenant`` (locked against deletion until this transaction ends)."""
        return bool(await fetch_in(self.connection, self._store._tenant, {"tenant": tenant}))
