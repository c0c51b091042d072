"""``PgTransaction``, and ``connection_of``: the way from a port-typed transaction to its connection, for adapters
that are not repositories (repositories are bound to it by ``tx.repository(KEY)``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import attrs

from bettercompute.errors import InternalError
from bettercompute.ports import AuditRecord, OutboxEvent, Repository, ResourceRef, Transaction, WorkItem

from ._db import Connection, Database, Statement, defer_in, dumps, fetch_in
from ._outbox import PgOutbox
from ._queue import PgWorkQueue
from ._repository import PgRepository

R = TypeVar("R")

__all__ = ["PgTransaction", "TransactionParts", "connection_of"]

_PROJECT = """
INSERT INTO {s}.authz_resources (resource_type, resource_id, tenant_id, pool_id, owner)
VALUES (:type, :id, :tenant, :pool, :owner)
ON CONFLICT (resource_type, resource_id) DO UPDATE
SET tenant_id = EXCLUDED.tenant_id, pool_id = EXCLUDED.pool_id, owner = EXCLUDED.owner
"""

_UNPROJECT = "DELETE FROM {s}.authz_resources WHERE resource_type = :type AND resource_id = :id"

# The tenants are the embedded IAM's (its migrations create them in this schema; a process with RemoteIam shares
# the schema of the central IAM's store). FOR KEY SHARE keeps the row until the transaction that relies on it ends.
_TENANT = "SELECT id FROM {s}.iam_tenants WHERE id = :tenant FOR KEY SHARE"

_AUDIT = """
INSERT INTO {s}.audit (action, actor, tenant, resource_type, resource_id, decision_id, outcome, details)
VALUES (:action, :actor, :tenant, :resource_type, :resource_id, :decision_id, :outcome, CAST(:details AS jsonb))
"""


@attrs.frozen(kw_only=True)
class TransactionParts:
    """What every transaction of one store shares: the store's adapters by key, its queue and outbox, and the
    statements of the audit, the projection and the tenant check (made once per store)."""

    adapter_of: Callable[[Repository[Any]], PgRepository]
    queue: PgWorkQueue
    outbox: PgOutbox
    audit: Statement
    project: Statement
    unproject: Statement
    tenant: Statement

    @classmethod
    def of(
        cls,
        db: Database,
        *,
        adapter_of: Callable[[Repository[Any]], PgRepository],
        queue: PgWorkQueue,
        outbox: PgOutbox,
    ) -> TransactionParts:
        """The parts of ``db``'s transactions."""
        return cls(
            adapter_of=adapter_of,
            queue=queue,
            outbox=outbox,
            audit=db.sql(_AUDIT),
            project=db.sql(_PROJECT),
            unproject=db.sql(_UNPROJECT),
            tenant=db.sql(_TENANT),
        )


def connection_of(tx: Transaction) -> Connection:
    """The psycopg connection of a transaction of the PostgreSQL store, to run statements in it (``fetch_in``): for
    adapters that are not repositories (a workflow step's own table, a test's statement). A repository is reached
    with ``tx.repository(KEY)`` instead.

    Raises:
        InternalError: ``tx`` is another store's transaction (a composition error: PostgreSQL repositories and
            adapters work only with ``PgStore``).
    """
    if not isinstance(tx, PgTransaction):
        raise InternalError("this needs a transaction of the PostgreSQL store")
    return tx.connection


class PgTransaction:
    """One transaction (``bettercompute.ports.Transaction``).

    ``repository(KEY)`` is the store's adapter bound to this transaction, made once per key and transaction.
    ``connection`` is the transaction's psycopg ``AsyncConnection`` (in autocommit, inside an explicit BEGIN), for
    PostgreSQL adapters that are not repositories and write their own tables in the same transaction;
    ``connection_of(tx)`` gets it from a port-typed transaction. Do not commit, roll back or change its settings
    yourself.
    """

    def __init__(self, parts: TransactionParts, connection: Connection) -> None:
        self._parts = parts
        self.connection = connection
        self.enqueued: set[str] = set()
        self.published = False
        self._bound: dict[Repository[Any], PgRepository] = {}

    def repository(self, key: Repository[R]) -> R:
        """The store's adapter for ``key`` bound to this transaction (the same object for every ask in it).

        Raises:
            InvalidConfigError: the store ships no such repository.
        """
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = self._parts.adapter_of(key).bound(self.connection)
        # As in PgStore.repository: the adapter registered under this key implements the key's protocol.
        return cast(R, bound)

    async def enqueue(self, items: Sequence[WorkItem]) -> None:
        """Add work that becomes visible when the transaction commits."""
        await self._parts.queue.enqueue_in(self.connection, items)
        self.enqueued.update(item.kind for item in items)

    async def publish(self, events: Sequence[OutboxEvent]) -> None:
        """Add outbox events that become visible, numbered per key, when the transaction commits.

        Each key's counter stays locked until the transaction ends (that is what makes the numbers follow commit
        order): publish a transaction's events in one call, or in the same key order everywhere, so that two
        transactions never wait for each other's keys in opposite orders (PostgreSQL would abort one of them with
        a deadlock, reported as a retryable ``UnavailableError``).
        """
        await self._parts.outbox.publish_in(self.connection, events)
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
        defer_in(self.connection, self._parts.audit, params)

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
        defer_in(self.connection, self._parts.project, params)

    async def unproject(self, resource_type: str, resource_id: str) -> None:
        """Forget a deleted resource."""
        defer_in(self.connection, self._parts.unproject, {"type": resource_type, "id": resource_id})

    async def tenant_exists(self, tenant: str) -> bool:
        """Whether the IAM knows ``tenant`` (locked against deletion until this transaction ends)."""
        return bool(await fetch_in(self.connection, self._parts.tenant, {"tenant": tenant}))
