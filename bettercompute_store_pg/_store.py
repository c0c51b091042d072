"""``PgStore``: the PostgreSQL implementation of ``bettercompute.ports.Store``."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from bettercompute.errors import InternalError, InvalidConfigError
from bettercompute.ports import Lease, Migration, Repository, transaction_scope

from ._db import Connection, Database, PoolUsage, Statement, driver_url, utc
from ._errors import translated
from ._idempotency import PgIdempotencyKeys
from ._leases import PgLeases
from ._membership import PgMembership
from ._migrations import RUNTIME, run_migrations, shipped_formerly, shipped_migrations
from ._outbox import PgOutbox
from ._queue import PgWorkQueue
from ._replay import PgReplayGuard
from ._repository import PgRepository, PokingRepository
from ._roles import RoleNames, grant_roles_in
from ._schema import validate_schema
from ._transaction import PgTransaction, TransactionParts
from ._workflows import PgWorkflows

__all__ = ["PgStore", "PgTransaction"]

R = TypeVar("R")

log = logging.getLogger("bettercompute.store_pg")

EnqueueListener = Callable[[frozenset[str]], Awaitable[None]]
PublishListener = Callable[[], Awaitable[None]]


class PgStore:
    """The authoritative state in PostgreSQL, every table in one schema.

    Nothing connects before ``open()``. All pooled statements are PgBouncer-safe (transaction mode): no session
    settings, no session locks, no LISTEN; with ``prepared_statements=False`` no server-side prepared statements
    either.

    Every statement runs on a pooled psycopg connection directly (see ``_db``): a statement on its own in one round
    trip (autocommit), a transaction as BEGIN ... COMMIT on one connection. ``repository(KEY)`` is a module's
    adapter (a ``PgRepository``) running each call on its own; ``tx.repository(KEY)`` the same adapter bound to the
    transaction's connection. Adapters of other packages that are not repositories reach that connection with
    ``connection_of(tx)``. ``connection()`` lends a pooled connection outside any transaction; ``pool_usage``
    tells how the pool is used.

    ``on_enqueued`` and ``on_published`` listeners (the control plane's notifier pokes) run after the commit of a
    transaction that enqueued work or published events, outside it.

    The runtime's tables are migrated under the name ``"runtime"`` by ``await store.install()``; each module's tables
    under the module's name, from ``store.migrations(name)`` (``BetterCompute.migrate()`` runs both).

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
        self._repositories: dict[tuple[str, str], PgRepository] = {}
        self._enqueue_listeners: list[EnqueueListener] = []
        self._publish_listeners: list[PublishListener] = []
        self.leases = PgLeases(self._db)
        self.queue = PgWorkQueue(self._db, self._enqueued)
        self.membership = PgMembership(self._db)
        self.outbox = PgOutbox(self._db)
        self.idempotency = PgIdempotencyKeys(self._db)
        self.nonces = PgReplayGuard(self._db)
        self._parts = TransactionParts.of(self._db, adapter_of=self._adapter_of, queue=self.queue, outbox=self.outbox)
        self._ping = self._db.sql("SELECT now() AS now")

    def repository(self, key: Repository[R]) -> R:
        """The adapter of a module's repository, outside any transaction (``tx.repository(key)`` binds it to one).

        Found in ``bettercompute_store_pg.modules.<module>._repository``, or in the Python module the key names in
        ``adapters["postgresql"]`` (a module of another package), by name in its ``REPOSITORIES``; made once per
        store.

        Raises:
            InvalidConfigError: this store ships no such repository.
        """
        # The adapter registered under this key implements its protocol: the key's type says which one.
        return cast(R, self._adapter_of(key))

    def _adapter_of(self, key: Repository[Any]) -> PgRepository:
        """The store's own (unbound) adapter for ``key``, made on first use.

        Raises:
            InvalidConfigError: this store ships no such repository.
        """
        made = self._repositories.get((key.module, key.name))
        if made is None:
            made = self._repositories[(key.module, key.name)] = _adapter(key, self._db)
            if isinstance(made, PokingRepository):
                made.poke_with(self._after_commit)
        return made

    async def _after_commit(self, kinds: frozenset[str], published: bool) -> None:
        """What a commit that enqueued ``kinds`` (and published, when ``published``) tells the listeners."""
        if kinds:
            await self._enqueued(kinds)
        if published:
            await self._published()

    def __repr__(self) -> str:
        return f"PgStore(url={self._url.render_as_string(hide_password=True)!r}, schema={self.schema!r})"

    @property
    def dialect(self) -> str:
        """``"postgresql"``: modules list the migrations this store runs under that name."""
        return "postgresql"

    @property
    def pool_usage(self) -> PoolUsage:
        """How the pool is used (checkouts so far, connections held now and at most): every database access of
        the store, by any path, checks one connection out."""
        return self._db.usage

    def pool_stats(self) -> dict[str, int]:
        """The pool now, from counters kept in memory (no statement; the core's metrics read it at each scrape):
        ``in_use`` connections handed out, ``idle`` ones open and free, ``max`` the pool's size."""
        pool = self._db.pool
        return {"in_use": self._db.usage.in_use, "idle": pool.idle if pool is not None else 0, "max": self._pool_size}

    @property
    def pool_capacity(self) -> int:
        """The most pooled connections handed out at once (``pool_size``; the pool never overflows it)."""
        return self._pool_size

    @staticmethod
    def runtime_migrations() -> list[Migration]:
        """The migrations ``install()`` applies under the name ``"runtime"``: the runtime's own tables."""
        return list(shipped_migrations(RUNTIME))

    @staticmethod
    def migrations(module: str) -> tuple[Migration, ...]:
        """The migrations this store ships for the module named ``module`` (its tables), found by that name in
        ``bettercompute_store_pg.modules``; ``()`` for a name it ships nothing for, and for ``"runtime"`` (which
        ``install()`` applies)."""
        return () if module == RUNTIME else shipped_migrations(module)

    async def open(self) -> None:
        """Create the pool; connections are made on first use. Idempotent."""
        self._db.open(self._url, pool_size=self._pool_size, prepared_statements=self._prepared_statements)

    async def close(self) -> None:
        """Close every pooled connection. Idempotent."""
        await self._db.close()

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

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A pooled psycopg connection of its own (in autocommit), for statements outside any transaction: tests,
        tools and adapters' one-off statements. Leave it idle (no transaction open) when the block ends; a
        connection left otherwise is dropped, not pooled.

        Raises:
            UnavailableError: The database cannot be reached, or no pooled connection was free in time.
        """
        async with self._db.connection() as conn:
            yield conn

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

        A built-in module that was renamed (``FORMERLY`` in its ``_migrations.py``) first takes over the versions
        recorded under its old name, so they do not run again.

        Returns:
            The versions this call applied.

        Raises:
            InvalidConfigError: Duplicate versions, or a recorded version whose name changed.
            UnavailableError: The database cannot be reached.
        """
        with translated():
            async with self._db.transaction() as conn:
                return await run_migrations(conn, self.schema, module, migrations, formerly=shipped_formerly(module))

    async def install(self) -> list[int]:
        """Apply the runtime's migrations (leases, work queue, outbox, idempotency, audit, membership, workflows).

        Returns:
            The ``"runtime"`` versions this call recorded; idempotent and safe from several processes at once.

        Raises:
            InvalidConfigError: A recorded version whose name changed.
            UnavailableError: The database cannot be reached.
        """
        return await self.migrate(RUNTIME, shipped_migrations(RUNTIME))

    async def grant_roles(self, prefix: str) -> RoleNames:
        """Make one database role per process mode (``<prefix>_api``, ``<prefix>_worker``, ``<prefix>_gateway``)
        where missing, and set their grants on this schema (``_roles``); idempotent. Run it after the migrations,
        with a login that may create roles and owns the schema.

        Raises:
            InvalidConfigError: the prefix is not a lower-case identifier, or this login may not create the roles
                or grant on the schema.
            UnavailableError: The database cannot be reached.
        """
        names = RoleNames(prefix)
        await self.open()
        try:
            with translated():
                async with self._db.transaction() as conn:
                    await grant_roles_in(conn, self.schema, names)
        except InternalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != "42501":  # insufficient_privilege
                raise
            raise InvalidConfigError(
                "this database login may not make or grant the process roles: migrate as the schema's owner, with "
                "CREATEROLE (or have the roles made beforehand)",
                details={"problems": list(names.all())},
            ) from None
        return names

    @contextlib.asynccontextmanager
    async def transaction(self, *, fence: Lease | None = None) -> AsyncIterator[PgTransaction]:
        """A transaction: commits when the block ends, rolls back if it raises.

        With ``fence``, the lease row is checked and share-locked first, so no one can take the lease over before
        this transaction ends.

        Raises:
            FailedPreconditionError: ``fence`` is no longer held with its token (nothing is written).
            UnavailableError: The database cannot be reached.
        """
        # The scope marks the task as holding a transaction, for the test doubles that refuse network I/O in one.
        with translated(), transaction_scope():
            async with self._db.transaction() as conn:
                if fence is not None:
                    await self.leases.check_fence(conn, fence)
                tx = PgTransaction(self._parts, conn)
                yield tx
        if tx.enqueued:
            await self._enqueued(frozenset(tx.enqueued))
        if tx.published:
            await self._published()


_MODULE = re.compile(r"[a-z][a-z0-9_]{0,62}")
_PYTHON_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


_RUNTIME_REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {"workflows": PgWorkflows}
"""The runtime's own repositories (``bettercompute.ports.WORKFLOWS``), by ``Repository.name``."""


def _adapter(key: Repository[Any], db: Database) -> PgRepository:
    """A new adapter for ``key``, found by the module's name (or the Python module its key names): no central list
    of modules."""
    missing = InvalidConfigError(
        f"the PostgreSQL store has no repository {key.name!r} of module {key.module!r}",
        details={"problems": [f"{key.module}.{key.name}"]},
    )
    if not _MODULE.fullmatch(key.module):
        raise missing
    if key.module == RUNTIME:
        factory = _RUNTIME_REPOSITORIES.get(key.name)
        if factory is None:
            raise missing
        return factory(db)
    name = key.adapters.get("postgresql") or f"bettercompute_store_pg.modules.{key.module}._repository"
    if not _PYTHON_MODULE.fullmatch(name):
        raise missing
    try:
        found = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # Only the absence of that package or file means "no such repository"; a broken import inside it is a bug.
        if exc.name is not None and (exc.name == name or name.startswith(exc.name + ".")):
            raise missing from None
        raise
    factory = getattr(found, "REPOSITORIES", {}).get(key.name)
    if factory is None:
        raise missing
    made = factory(db)
    if not isinstance(made, PgRepository):
        raise InternalError(f"the adapter of {key.module}.{key.name} is not a PgRepository")
    return made
