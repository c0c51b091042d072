"""The work queue: items claimed with fencing, retried with backoff."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports.leases import Lease

__all__ = ["Claim", "WorkItem", "WorkQueue"]


@attrs.frozen(kw_only=True)
class WorkItem:
    """A request that ``key`` of ``kind`` be worked on at or after ``run_at`` (now when ``None``)."""

    kind: str
    key: str
    shard: int = 0
    payload: Mapping[str, Any] = attrs.field(factory=dict)
    run_at: dt.datetime | None = None


@attrs.frozen(kw_only=True)
class Claim:
    """A work item claimed by one holder until ``claimed_until``; ``token`` proves the claim is still its own."""

    id: int
    kind: str
    key: str
    shard: int
    payload: Mapping[str, Any]
    attempts: int
    token: str
    claimed_until: dt.datetime
    last_error: str | None = None
    due_at: dt.datetime | None = None
    """When the item became due (its ``run_at``, or when an earlier claim ran out), on the clock that decided it was
    due; ``None`` from a store that does not say. The metrics' claim latency is ``claimed_until - claim_for - due_at``.
    """


class WorkQueue(Protocol):
    """The work queue: claims with ``FOR UPDATE SKIP LOCKED`` semantics, so concurrent claimers never share work.

    At most one ready item exists per ``(kind, key)``: enqueuing a key that is already waiting keeps one item and
    the earlier ``run_at``. A key that is claimed is not handed to a second claimer until its claim ends or expires.
    """

    async def enqueue(self, items: Sequence[WorkItem]) -> None:
        """Add work in its own transaction (use ``Transaction.enqueue`` to add it with a state change)."""
        ...

    async def claim(
        self,
        *,
        holder: str,
        kinds: Sequence[str],
        limit: int,
        claim_for: dt.timedelta,
        shards: Sequence[int] | None = None,
        fence: Lease | None = None,
        now: dt.datetime | None = None,
        owner_prefix: str | None = None,
    ) -> list[Claim]:
        """Claim up to ``limit`` due items, oldest ``run_at`` first.

        Expired claims are due again. With ``fence``, nothing is claimed (empty list) unless the lease is still held
        with that token. With ``owner_prefix``, only items on shards whose lease ``<owner_prefix><shard>`` is held
        (unexpired) by ``holder``. ``now`` replaces the store's clock in deciding what is due and when the claim expires
        (``jobs.tick()`` passes an injected clock's time).
        """
        ...

    async def complete(
        self,
        claim: Claim,
        *,
        fence: Lease | None = None,
        again_after: dt.timedelta | None = None,
        now: dt.datetime | None = None,
    ) -> bool:
        """Remove finished work. ``False`` (and no change) if the claim was lost, e.g. it expired and was re-claimed,
        or if ``fence`` is no longer held with its token.

        With ``again_after``, the item stays, ready again after that delay (counted from ``now`` when given), with
        its attempts and error cleared; work enqueued meanwhile merges in at the earlier time.
        """
        ...

    async def retry(
        self,
        claim: Claim,
        *,
        delay: dt.timedelta,
        error: str,
        fence: Lease | None = None,
        now: dt.datetime | None = None,
    ) -> bool:
        """Hand the item back, due after ``delay`` (from ``now`` when given), recording ``error``. ``False`` if the
        claim was lost or ``fence`` is stale."""
        ...

    async def extend(self, claim: Claim, claim_for: dt.timedelta) -> Claim | None:
        """Keep a long-running claim alive; ``None`` if it was lost."""
        ...

    async def pending(self, kinds: Sequence[str] | None = None) -> int:
        """How many items wait or run (for health checks and tests)."""
        ...

    async def depth(self, kinds: Sequence[str]) -> dict[str, int]:
        """Per kind of ``kinds``, how many items are due and not running now: ready and due, or claimed with the
        claim run out (one statement; the worker samples it for the ``bettercompute_queue_depth`` gauge). Kinds with
        none may be left out."""
        ...
