"""Reservations as the store keeps them, and the operations admission is made of.

Admission is two operations, each one statement in the PostgreSQL store (DESIGN §5, §12): ``begin`` (transaction 1:
the idempotency key, the draft and its projection row) and ``admit`` (transaction 2: quota, placement, bookings,
the audit row, the event and the binding work, in one database function). ``abandon`` undoes a draft the IAM
refused.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs

from bettercompute._runtime.idempotency import IdempotentRequest
from bettercompute.ports import Repository, WorkItem

__all__ = [
    "RESERVATIONS",
    "AdmitOutcome",
    "AdmitRequest",
    "BeginOutcome",
    "Draft",
    "ReservationRecord",
    "Reservations",
]


@attrs.frozen(kw_only=True)
class ReservationRecord:
    """A stored reservation (``state`` ``draft`` only between admission's two transactions). ``placement`` is
    ``{"nodes": [{"node_id", "atoms": [ident, ...], "atom_ids": [...]}], "why": {...}}``; ``generations`` maps each
    node to the desired-state generation that first carried it; ``history`` is ``[{"state", "at", "reason"}]``."""

    id: str
    tenant: str
    pool_id: str
    state: str
    gpus: int
    constraints: Mapping[str, Any]
    start_at: dt.datetime
    end_at: dt.datetime
    labels: Mapping[str, str]
    placement: Mapping[str, Any]
    generations: Mapping[str, int]
    reason: str | None
    history: Sequence[Mapping[str, Any]]
    created_by: str
    created_at: dt.datetime
    updated_at: dt.datetime

    @property
    def node_ids(self) -> list[str]:
        """The nodes holding its atoms."""
        return [str(n["node_id"]) for n in self.placement.get("nodes") or ()]


@attrs.frozen(kw_only=True)
class Draft:
    """What transaction 1 writes: the draft row and, with a key, the idempotency reservation."""

    id: str
    tenant: str
    pool_id: str
    pool_tenants: tuple[str, ...]
    gpus: int
    constraints: Mapping[str, Any]
    start_at: dt.datetime
    end_at: dt.datetime
    labels: Mapping[str, str]
    created_by: str
    now: dt.datetime
    idempotency_key: str | None = None
    request_hash: str | None = None
    ttl: dt.timedelta = dt.timedelta(hours=24)


@attrs.frozen(kw_only=True)
class BeginOutcome:
    """``drafted``: the draft is written (go on to the IAM and ``admit``); ``no_pool``: no such pool in the tenant
    (nothing written); ``replay``: the key's stored answer (``result``); ``conflict``: the key names another request;
    ``in_progress``: a call with the key is still running."""

    state: Literal["drafted", "no_pool", "replay", "conflict", "in_progress"]
    result: Mapping[str, Any] | None = None


@attrs.frozen(kw_only=True)
class AdmitRequest:
    """Transaction 2 of one drafted reservation: what to place (the constraints, as ``share`` of a GPU per atom),
    over which window, who decided, and the work and event that follow it. How the store wakes the workers about
    what it enqueues and publishes is the store's own."""

    id: str
    share: float
    model: str | None
    min_memory_mib: int | None
    one_node: bool
    nvlink: bool
    mig_profile: str | None
    now: dt.datetime
    horizon: dt.timedelta
    """How far past ``now`` ``NO_CAPACITY`` looks for the earliest start that would fit."""
    actor: str
    action: str
    decision_id: str | None
    event_type: str
    """The event a placed reservation publishes."""
    work: WorkItem
    """The work item that carries the reservation on: its controller's, or (``defer``) its pool placer's."""
    defer: bool = False
    """Leave placement to the pool-lease placer: the reservation is ``pending``."""
    idempotency: IdempotentRequest | None = None
    """The call's key, whose stored answer is this reservation."""


@attrs.frozen(kw_only=True)
class AdmitOutcome:
    """``placed`` (with the record); ``no_capacity`` (``excluded``: atoms left out per reason; ``earliest_start``:
    when it would fit, within the horizon); ``quota`` (``detail``: which limit, used and asked); ``too_long`` (the
    quota's ``max_reservation_hours`` in ``detail``); ``gone``: the draft is no longer there."""

    state: Literal["placed", "pending", "no_capacity", "quota", "too_long", "gone"]
    record: ReservationRecord | None = None
    excluded: Mapping[str, int] = attrs.field(factory=dict)
    earliest_start: dt.datetime | None = None
    detail: Mapping[str, Any] = attrs.field(factory=dict)


class Reservations(Protocol):
    """Reservations and their bookings. ``begin``, ``admit`` and ``abandon`` are each one statement, outside any
    transaction of the caller's; the others that write need a transaction (``tx.repository(RESERVATIONS)``)."""

    async def begin(self, draft: Draft) -> BeginOutcome:
        """Transaction 1: the idempotency lookup (with a key), the draft and its projection row."""
        ...

    async def abandon(self, reservation_id: str, *, identity: str | None, key: str | None) -> None:
        """Undo a draft: the row, its projection row and an unfinished idempotency key."""
        ...

    async def admit(self, request: AdmitRequest) -> AdmitOutcome:
        """Transaction 2: quota, placement, bookings, the audit row, the event and the binding work item; a draft
        that does not fit is undone in the same transaction."""
        ...

    async def get(self, reservation_id: str) -> ReservationRecord | None:
        """A reservation (a draft is ``None``)."""
        ...

    async def get_for_update(self, reservation_id: str) -> ReservationRecord | None:
        """A reservation, locked until the transaction ends."""
        ...

    async def page(
        self,
        tenant: str,
        *,
        state: str | None,
        pool_id: str | None,
        overlaps_start: dt.datetime | None,
        overlaps_end: dt.datetime | None,
        label: tuple[str, str] | None,
        after: Sequence[Any] | None,
        limit: int,
    ) -> list[ReservationRecord]:
        """A tenant's reservations, newest first (by ``created_at``, then ``id``), after the key ``after``."""
        ...

    async def on_node(self, node_id: str, *, at: dt.datetime) -> list[ReservationRecord]:
        """The reservations a node's desired state carries: placed, bound or active on it, not over at ``at``."""
        ...

    async def transition(
        self,
        record: ReservationRecord,
        *,
        state: str,
        at: dt.datetime,
        reason: str | None = None,
        generations: Mapping[str, int] | None = None,
        end_at: dt.datetime | None = None,
    ) -> ReservationRecord:
        """Write a new state (appending to its history), or only new generations when ``state`` is its own."""
        ...

    async def release(self, reservation_id: str, *, at: dt.datetime) -> int:
        """End its bookings at ``at``: those not started yet go, the others are cut at ``at``; how many changed. Its
        atoms are no longer held by it (the placer looks at them first again). Releasing twice changes nothing."""
        ...

    async def extend(self, reservation_id: str, *, end_at: dt.datetime, now: dt.datetime) -> AdmitOutcome:
        """Move a live reservation's end (and its bookings') to ``end_at``, with the quota checked under its lock:
        ``placed`` with the record, ``no_capacity`` when one of its atoms is booked in between, ``quota`` or
        ``too_long``; ``gone`` when it is not live (``detail["state"]``) or ``end_at`` is not later."""
        ...

    async def place_pending(
        self, pool_id: str, *, now: dt.datetime, horizon: dt.timedelta, limit: int
    ) -> tuple[list[str], list[str], int]:
        """The pool-lease placer's pass over a pool, one call: its pending reservations, oldest first, placed or
        failed (nothing fits); ``(placed ids, failed ids, still pending)``."""
        ...

    async def drafts_before(self, before: dt.datetime, *, limit: int) -> list[str]:
        """Drafts older than ``before`` (left by a process that stopped between admission's transactions)."""
        ...


RESERVATIONS: Repository[Reservations] = Repository(module="reservations", name="reservations")
