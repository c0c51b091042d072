"""Reconcilers: what a module declares to have keys of one kind worked on, one at a time, on the shard's owner."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import attrs

from bettercompute._runtime.shards import SHARDS, shard_of
from bettercompute.errors import ComputeError
from bettercompute.ports import Clock, Lease, Store, Transaction, WorkItem

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = ["RECONCILER_ROLES", "Outcome", "ReconcileContext", "Reconciler", "RetryPolicy", "reason_of"]

RECONCILER_ROLES = frozenset({"controllers", "scheduler"})


@attrs.frozen(kw_only=True)
class Outcome:
    """What a reconcile pass asks for: nothing more (``done()``) or another pass after a delay (``requeue()``)."""

    requeue_after: dt.timedelta | None = None

    @classmethod
    def done(cls) -> Outcome:
        """The key is reconciled; its work item is removed (unless the key was enqueued again meanwhile)."""
        return cls()

    @classmethod
    def requeue(cls, after: dt.timedelta = dt.timedelta(0)) -> Outcome:
        """Reconcile the key again after ``after``, as a fresh item (attempts and error cleared)."""
        return cls(requeue_after=after)


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """Exponential backoff with jitter after a failed pass, and when to give up.

    The delay before attempt ``n + 1`` is ``base * 2 ** (n - 1)``, capped at ``max_delay``, times a jitter factor in
    ``[1 - jitter, 1 + jitter]``. The jitter is drawn from the kind, key and attempt, so different keys spread out
    while one replayed history (``jobs.tick()``) repeats exactly.
    """

    base: dt.timedelta = dt.timedelta(seconds=1)
    max_delay: dt.timedelta = dt.timedelta(minutes=5)
    max_attempts: int = 10
    jitter: float = attrs.field(
        default=0.2, validator=attrs.validators.and_(attrs.validators.ge(0.0), attrs.validators.le(1.0))
    )

    def delay(self, kind: str, key: str, attempt: int) -> dt.timedelta:
        """The backoff after failed attempt ``attempt`` (from 1) of ``key``."""
        seconds = min(self.max_delay.total_seconds(), self.base.total_seconds() * 2 ** max(0, min(attempt - 1, 40)))
        factor = random.Random(f"{kind}\x00{key}\x00{attempt}").uniform(1 - self.jitter, 1 + self.jitter)  # noqa: S311 - jitter, not security
        return dt.timedelta(seconds=seconds * factor)


@attrs.frozen(kw_only=True)
class ReconcileContext:
    """What one reconcile pass gets: the control plane's parts, the work item, and the shard lease it runs under.

    Write through ``transaction()``: it is fenced by the shard lease, so once the shard has moved to another worker,
    this pass's writes are refused (``FailedPreconditionError``) instead of racing the new owner's.
    """

    context: ModuleContext
    kind: str
    key: str
    payload: Mapping[str, Any]
    attempt: int
    last_error: str | None
    lease: Lease | None

    @property
    def store(self) -> Store:
        """The store (for reads; write through ``transaction()``)."""
        return self.context.store

    @property
    def clock(self) -> Clock:
        """The control plane's clock (a ``ManualClock`` in tests)."""
        return self.context.clock

    def transaction(self) -> AbstractAsyncContextManager[Transaction]:
        """A transaction fenced by the shard lease (unfenced under ``jobs.tick()``, which holds no leases)."""
        return self.context.store.transaction(fence=self.lease)


Reconcile = Callable[[ReconcileContext, str], Awaitable[Outcome]]
OnFailure = Callable[[ReconcileContext, str, str], Awaitable[None]]


def _positive(instance: Any, attribute: Any, value: dt.timedelta) -> None:
    if value <= dt.timedelta(0):
        raise ValueError(f"{attribute.name} must be positive")


@attrs.frozen(kw_only=True)
class Reconciler:
    """Drives keys of one ``kind`` towards their desired state; declared by a module in its ``reconcilers``.

    Work items of ``kind`` are claimed only by the worker holding their shard's lease in ``role`` (``controllers``
    or ``scheduler``), so one key is never reconciled twice at once. Enqueue them with ``item(key)`` in the same
    transaction as the change that needs them (``tx.enqueue([reconciler.item(key)])``), so the shard is right.

    Args:
        kind: The work item kind (unique across the control plane).
        reconcile: ``async (ctx, key) -> Outcome``; raising (or overrunning ``deadline``) is a failed attempt.
        role: ``controllers`` (default) or ``scheduler``; it runs only in worker processes of that role.
        shard_of: Maps a key to its shard in ``[0, 256)``; by default a stable hash of the key.
        deadline: How long one pass may run before it is cancelled and counted as failed (``DEADLINE_EXCEEDED``).
        retry: Backoff between failed attempts and how many attempts to make.
        on_failure: ``async (ctx, key, reason)``, called when the last attempt failed, to record the reason on the
            object; the work item is then removed.
    """

    kind: str
    reconcile: Reconcile
    role: str = attrs.field(default="controllers", validator=attrs.validators.in_(RECONCILER_ROLES))
    shard_of: Callable[[str], int] = shard_of
    deadline: dt.timedelta = attrs.field(default=dt.timedelta(seconds=30), validator=_positive)
    retry: RetryPolicy = RetryPolicy()
    on_failure: OnFailure | None = None

    def item(
        self, key: str, *, payload: Mapping[str, Any] | None = None, run_at: dt.datetime | None = None
    ) -> WorkItem:
        """A work item for ``key``, on its shard."""
        return WorkItem(
            kind=self.kind, key=key, shard=self.shard_of(key) % SHARDS, payload=dict(payload or {}), run_at=run_at
        )


def reason_of(exc: BaseException) -> str:
    """A machine-readable reason for a failed pass: an error code, ``DEADLINE_EXCEEDED``, or ``EXCEPTION:<type>``.

    Never the message, which may hold anything (a secret, a row).
    """
    if isinstance(exc, ComputeError):
        return exc.code
    if isinstance(exc, TimeoutError):
        return "DEADLINE_EXCEEDED"
    return f"EXCEPTION:{type(exc).__name__}"
