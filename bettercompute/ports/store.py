"""The store: transactions, the runtime's tables, and each module's repositories by typed key (``Repository``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeVar

from bettercompute.ports.idempotency import IdempotencyKeys
from bettercompute.ports.leases import Lease, Leases
from bettercompute.ports.membership import Membership
from bettercompute.ports.migrations import Migration
from bettercompute.ports.outbox import Outbox
from bettercompute.ports.queue import WorkQueue
from bettercompute.ports.replay import ReplayGuard
from bettercompute.ports.repository import Repository
from bettercompute.ports.transaction import Transaction

__all__ = ["Repository", "Store"]

R = TypeVar("R")


class Store(Protocol):
    """The authoritative state. The only implementation shipped is ``bettercompute_store_pg.PgStore``.

    ``open`` may be called before ``migrate``; nothing opens a connection before ``open``. Every method may raise
    ``UnavailableError`` when the database cannot be reached.

    Optional member, not part of this protocol so that stores without a pool still conform: ``pool_capacity``, an
    ``int``, the most connections the store hands out at once (read with ``getattr(store, "pool_capacity",
    None)``). ``better_compute()`` checks ``Options.max_in_flight`` and the worker loops' needs against it.
    """

    @property
    def dialect(self) -> str:
        """Which migrations this store runs: modules list theirs under this name (``"postgresql"``)."""
        ...

    def repository(self, key: Repository[R]) -> R:
        """The store's repository for ``key``, outside any transaction: each call runs on its own (a read sees what
        is committed, a write allowed here commits at once). Inside a transaction use ``tx.repository(key)``; a
        method that needs one raises ``InternalError`` here. The runtime's workflow store is reached the same way,
        by the key ``bettercompute.ports.WORKFLOWS``.

        Raises:
            InvalidConfigError: this store has no repository of that module and name.
        """
        ...

    @property
    def leases(self) -> Leases:
        """Leases with fencing tokens."""
        ...

    @property
    def queue(self) -> WorkQueue:
        """The work queue."""
        ...

    @property
    def outbox(self) -> Outbox:
        """Committed events."""
        ...

    @property
    def idempotency(self) -> IdempotencyKeys:
        """Idempotency keys."""
        ...

    @property
    def nonces(self) -> ReplayGuard:
        """Nonces seen by ``Unsealer`` (replay protection of sealed join payloads)."""
        ...

    @property
    def membership(self) -> Membership:
        """Worker membership rows."""
        ...

    def on_enqueued(self, listener: Callable[[frozenset[str]], Awaitable[None]]) -> Callable[[], None]:
        """Call ``listener(kinds)`` after each commit that enqueued work of ``kinds`` (``Transaction.enqueue`` or
        ``queue.enqueue``); a listener's failure is logged, never raised to the writer. Returns an unsubscribe."""
        ...

    async def open(self) -> None:
        """Prepare connections. Idempotent."""
        ...

    async def close(self) -> None:
        """Close every connection. Idempotent."""
        ...

    async def ping(self) -> None:
        """Raise ``UnavailableError`` unless the database answers now."""
        ...

    async def now(self) -> dt.datetime:
        """The database's clock (UTC), used to anchor the process's clock."""
        ...

    async def install(self) -> list[int]:
        """Apply the runtime's own migrations (its tables for leases, work, outbox, idempotency keys, audit, ...),
        upgrading in place a schema that an older layout of the store migrated.

        Returns the versions applied by this call; idempotent and safe from several processes at once.
        """
        ...

    def migrations(self, module: str) -> Sequence[Migration]:
        """The migrations the store ships for the module named ``module`` (the tables of its repository), found by
        that name; empty when it ships none. The core applies them, then the module's own, with ``migrate``."""
        ...

    async def migrate(self, module: str, migrations: Sequence[Migration]) -> list[int]:
        """Apply the module's migrations not applied yet, in version order, under a lock shared by all processes.

        Returns the versions applied by this call. Idempotent; safe to run from several processes at once.
        Raises ``InvalidConfigError`` for duplicate versions or a recorded version whose name changed.
        """
        ...

    def transaction(self, *, fence: Lease | None = None) -> AbstractAsyncContextManager[Transaction]:
        """A transaction. With ``fence``, it fails with ``FailedPreconditionError`` (and writes nothing) unless the
        lease is still held with that token when it commits. While it is open, ``in_transaction()`` is true in the
        task that opened it (run its body inside ``transaction_scope()``)."""
        ...
