"""``PgStore``: the PostgreSQL implementation of ``bettercompute.ports.Store``."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import select
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import psycopg
from sqlalchemy import event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, InvalidatePoolError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

from bettercompute.errors import InternalError, InvalidConfigError
from bettercompute.ports import AuditRecord, Lease, Migration, OutboxEvent, ResourceRef, WorkItem, transaction_scope

from ._certificates import PgCertificates
from ._commands import PgCommands, PgSessions
from ._db import Database, Statement, dumps, fetch_in, utc
from ._errors import translated
from ._idempotency import PgIdempotencyKeys
from ._leases import PgLeases
from ._membership import PgMembership
from ._migrations import run_migrations
from ._nodes import PgJoinKeys, PgNodes
from ._outbox import PgOutbox
from ._pools import PgJoinTokens, PgPools
from ._queue import PgWorkQueue
from ._replay import PgReplayGuard
from ._schema import CORE_MIGRATIONS, validate_schema
from ._secrets import PgSecrets
from ._usage import PgBookings, PgUsage
from ._webhooks import PgWebhooks
from ._workflows import PgWorkflows

__all__ = ["PgStore", "PgTransaction", "driver_url"]

log = logging.getLogger("bettercompute.store_pg")

EnqueueListener = Callable[[frozenset[str]], Awaitable[None]]
PublishListener = Callable[[], Awaitable[None]]

CONNECT_TIMEOUT_SECONDS = 5
"""libpq's connect timeout: an unreachable server fails fast instead of hanging a request."""

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


def driver_url(url: str) -> URL:
    """``url`` with the psycopg 3 driver (``postgresql://`` and ``postgres://`` are accepted too).

    Raises:
        InvalidConfigError: The URL cannot be parsed or names another database or driver.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        # The URL may hold a password: neither it nor the parser's text goes into the message.
        raise InvalidConfigError("the database URL cannot be parsed") from exc
    if parsed.drivername in ("postgresql", "postgres", "postgresql+psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    raise InvalidConfigError(
        "the database URL must start with postgresql:// or postgresql+psycopg://",
        details={"problems": [{"path": "url", "scheme": parsed.drivername}]},
    )


def _refuse_dead_connection(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: PoolProxiedConnection) -> None:
    """Hand out no pooled connection the server has already closed (a restart while the pool sat idle).

    A live idle connection has nothing to read: the server speaks only when asked. A readable socket means the
    server said goodbye (a FATAL message, then EOF) or sent something unasked; only then is the connection asked
    a ``SELECT 1``, so the usual checkout costs one ``poll`` and no round trip. A dead one invalidates the whole
    pool: after a restart every connection made before it is dead too, and the pool replaces them (SQLAlchemy
    reconnects on the spot) before any statement was sent, so none can have run twice.
    """
    conn = record.driver_connection
    if not isinstance(conn, psycopg.AsyncConnection):
        return
    try:
        if conn.closed or conn.broken:
            raise InvalidatePoolError("the pooled connection is closed")
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN)
        if not poller.poll(0):
            return
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT 1")
        finally:
            cursor.close()
        dbapi_connection.rollback()  # the driver began a transaction for the SELECT; leave the connection idle
    except InvalidatePoolError:
        raise
    except Exception as exc:
        raise InvalidatePoolError("the pooled connection was closed by the server") from exc


class PgTransaction:
    """One transaction (``bettercompute.ports.Transaction``).

    ``connection`` is the transaction's ``AsyncConnection``, for PostgreSQL adapters of other packages that write
    their own tables in the same transaction. Do not commit or roll it back yourself.
    """

    def __init__(self, store: PgStore, connection: AsyncConnection) -> None:
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
        await fetch_in(self.connection, self._store._audit, params)

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
        await fetch_in(self.connection, self._store._project, params)

    async def unproject(self, resource_type: str, resource_id: str) -> None:
        """Forget a deleted resource."""
        await fetch_in(self.connection, self._store._unproject, {"type": resource_type, "id": resource_id})

    async def tenant_exists(self, tenant: str) -> bool:
        """Whether the IAM knows ``tenant`` (locked against deletion until this transaction ends)."""
        return bool(await fetch_in(self.connection, self._store._tenant, {"tenant": tenant}))


class PgStore:
    """The authoritative state in PostgreSQL, every table in one schema.

    Nothing connects before ``open()``. All pooled statements are PgBouncer-safe (transaction mode): no session
    settings, no session locks, no LISTEN; with ``prepared_statements=False`` no server-side prepared statements
    either.

    ``on_enqueued`` and ``on_published`` listeners (the control plane's notifier pokes) run after the commit of a
    transaction that enqueued work or published events, outside it.

    The store's own tables are the migrations of module ``"core"``: ``await store.install()`` applies them (the same
    as ``await store.migrate("core", PgStore.core_migrations())``).

    Args:
        url: ``postgresql://`` or ``postgresql+psycopg://`` URL.
        schema: The schema holding every table (a lower-case identifier); created by the first migration.
        pool_size: Connections kept in the pool (no overflow beyond it).
        prepared_statements: ``False`` behind PgBouncer in transaction mode (sets psycopg's
            ``prepare_threshold=None``).

    Raises:
        InvalidConfigError: A malformed URL or schema name, or a pool size below 1.
    """

    def __init__(
        self, url: str, *, schema: str = "bettercompute", pool_size: int = 10, prepared_statements: bool = True
    ) -> None:
        # bool is an int to Python, never a size; a str would fail the comparison with a TypeError.
        if not isinstance(pool_size, int) or isinstance(pool_size, bool) or pool_size < 1:
            raise InvalidConfigError("pool_size must be at least 1", details={"problems": [{"path": "pool_size"}]})
        self._url = driver_url(url)
        self.schema = validate_schema(schema)
        self._pool_size = pool_size
        self._prepared_statements = prepared_statements
        self._db = Database(self.schema)
        self._enqueue_listeners: list[EnqueueListener] = []
        self._publish_listeners: list[PublishListener] = []
        self.leases = PgLeases(self._db)
        self.queue = PgWorkQueue(self._db, self._enqueued)
        self.membership = PgMembership(self._db)
        self.outbox = PgOutbox(self._db)
        self.idempotency = PgIdempotencyKeys(self._db)
        self.webhooks = PgWebhooks(self._db)
        self.secrets = PgSecrets(self._db)
        self.nonces = PgReplayGuard(self._db)
        self.workflows = PgWorkflows(self._db)
        self.pools = PgPools(self._db)
        self.join_tokens = PgJoinTokens(self._db)
        self.certificates = PgCertificates(self._db)
        self.nodes = PgNodes(self._db)
        self.join_keys = PgJoinKeys(self._db)
        self.commands = PgCommands(self._db)
        self.sessions = PgSessions(self._db)
        self.bookings = PgBookings(self._db)
        self.usage = PgUsage(self._db)
        self._audit = self._db.sql(_AUDIT)
        self._project = self._db.sql(_PROJECT)
        self._unproject = self._db.sql(_UNPROJECT)
        self._tenant = self._db.sql(_TENANT)
        self._ping = self._db.sql("SELECT now() AS now")

    def __repr__(self) -> str:
        return f"PgStore(url={self._url.render_as_string(hide_password=True)!r}, schema={self.schema!r})"

    @property
    def dialect(self) -> str:
        """``"postgresql"``: modules list the migrations this store runs under that name."""
        return "postgresql"

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine (open only); ``Table`` objects with ``schema=None`` resolve to ``self.schema``.

        Raises:
            InternalError: The store is not open.
        """
        return self._db.require()

    @property
    def pool_capacity(self) -> int:
        """The most pooled connections handed out at once (``pool_size``; the pool never overflows it)."""
        return self._pool_size

    @staticmethod
    def core_migrations() -> list[Migration]:
        """The migrations of module ``"core"``: the store's own tables."""
        return list(CORE_MIGRATIONS)

    async def open(self) -> None:
        """Create the engine and its pool; connections are made on first use. Idempotent."""
        if self._db.engine is not None:
            return
        connect_args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
        if not self._prepared_statements:
            connect_args["prepare_threshold"] = None
        engine = create_async_engine(
            self._url,
            pool_size=self._pool_size,
            max_overflow=0,
            pool_timeout=10,
            connect_args=connect_args,
            execution_options={"schema_translate_map": {None: self.schema}},
        )
        event.listen(engine.sync_engine.pool, "checkout", _refuse_dead_connection)
        self._db.attach(engine)

    async def close(self) -> None:
        """Close every pooled connection. Idempotent."""
        engine = self._db.engine
        self._db.attach(None)
        if engine is not None:
            with translated():
                await engine.dispose()

    async def __aenter__(self) -> PgStore:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def sql(self, template: str) -> Statement:
        """A statement for ``fetch``, with ``{s}`` standing for the store's quoted schema; build it once, reuse it."""
        return self._db.sql(template)

    async def fetch(self, statement: Statement, params: Mapping[str, Any]) -> list[Any]:
        """Run one statement on its own, in one round trip (autocommit); its rows, columns as attributes.

        For the reads of other packages' PostgreSQL adapters on a hot path (IAM's credential lookup, say).
        """
        return await self._db.fetch(statement, params)

    def on_enqueued(self, listener: EnqueueListener) -> Callable[[], None]:
        """Call ``listener(kinds)`` after each commit that enqueued work; returns an unsubscribe."""
        self._enqueue_listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._enqueue_listeners:
                self._enqueue_listeners.remove(listener)

        return unsubscribe

    async def _enqueued(self, kinds: frozenset[str]) -> None:
        for listener in list(self._enqueue_listeners):
            try:
                await listener(kinds)
            except Exception as exc:  # a poke is an optimisation: the writer's commit stands
                log.warning("an enqueue listener failed: %s", type(exc).__name__)

    def on_published(self, listener: PublishListener) -> Callable[[], None]:
        """Call ``listener()`` after each commit that published outbox events; returns an unsubscribe.

        A listener's failure is logged, never raised to the writer. (Not in ``bettercompute.ports.Store``: the
        control plane uses it when a store has it, to wake the ``sinks`` jobs.)
        """
        self._publish_listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._publish_listeners:
                self._publish_listeners.remove(listener)

        return unsubscribe

    async def _published(self) -> None:
        for listener in list(self._publish_listeners):
            try:
                await listener()
            except Exception as exc:  # a poke is an optimisation: the writer's commit stands
                log.warning("a publish listener failed: %s", type(exc).__name__)

    async def ping(self) -> None:
        """Raise ``UnavailableError`` unless the database answers now."""
        await self._db.fetch(self._ping, {})

    async def now(self) -> dt.datetime:
        """The database's clock, in UTC."""
        rows = await self._db.fetch(self._ping, {})
        return utc(rows[0].now)

    async def migrate(self, module: str, migrations: Sequence[Migration]) -> list[int]:
        """Apply ``module``'s pending migrations in version order under the schema's advisory lock.

        Returns:
            The versions this call applied.

        Raises:
            InvalidConfigError: Duplicate versions, or a recorded version whose name changed.
            UnavailableError: The database cannot be reached.
        """
        engine = self._db.require()
        with translated():
            return await run_migrations(engine, self.schema, module, migrations)

    async def install(self) -> list[int]:
        """Apply the store's own migrations (module ``"core"``: leases, work queue, outbox, idempotency, audit).

        Returns:
            The versions this call applied; idempotent and safe from several processes at once.
        """
        return await self.migrate("core", CORE_MIGRATIONS)

    @contextlib.asynccontextmanager
    async def transaction(self, *, fence: Lease | None = None) -> AsyncIterator[PgTransaction]:
        """A transaction: commits when the block ends, rolls back if it raises.

        With ``fence``, the lease row is checked and share-locked first, so no one can take the lease over before
        this transaction ends.

        Raises:
            FailedPreconditionError: ``fence`` is no longer held with its token (nothing is written).
            UnavailableError: The database cannot be reached.
        """
        engine = self._db.require()
        # The scope marks the task as holding a transaction, for the test doubles that refuse network I/O in one.
        with translated(), transaction_scope():
            async with engine.connect() as conn, conn.begin():
                if fence is not None:
                    await self.leases.check_fence(conn, fence)
                tx = PgTransaction(self, conn)
                yield tx
        if tx.enqueued:
            await self._enqueued(frozenset(tx.enqueued))
        if tx.published:
            await self._published()
