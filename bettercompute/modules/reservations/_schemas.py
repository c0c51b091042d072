"""Inputs and outputs of the ``reservations`` group.

A reservation asks for ``gpus`` atoms of one pool over ``[start_at, end_at)``; ``end_at`` or ``duration`` (ISO 8601,
``PT8H``, ``P2DT4H``, weeks ``P1W``; whole seconds, ASCII digits only) gives its end. Constraints narrow which atoms
fit: the GPU model (a case-insensitive part of the model name the node reports, such as ``H100``), the least memory
per GPU, all GPUs on one node, all NVLink-connected to each other (which implies one node), or MIG slices of one
profile instead of whole GPUs.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

import attrs

from bettercompute.fields import Integer, Text
from bettercompute.modules.pools import LABELS
from bettercompute.paging import PageInput

__all__ = [
    "MAX_GPUS_PER_RESERVATION",
    "MAX_HORIZON",
    "CancelReservationInput",
    "Constraints",
    "CreateReservationInput",
    "ExplainReservationInput",
    "Explanation",
    "ExtendReservationInput",
    "GetReservationInput",
    "ListReservationsInput",
    "ListReservationsOutput",
    "PlacedNode",
    "Reservation",
    "ReservationState",
    "Transition",
]

MAX_GPUS_PER_RESERVATION = 4096
"""The most atoms one reservation may ask for."""
MAX_HORIZON = dt.timedelta(days=30)
"""How long a reservation may last at most (a pool's quota may lower it), and how far ahead the earliest start of a
request that does not fit now is looked for."""

ReservationState = Literal["pending", "placed", "bound", "active", "ended", "cancelled", "failed"]

_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_GPUS = Integer(minimum=1, maximum=MAX_GPUS_PER_RESERVATION, reason=f"must be between 1 and {MAX_GPUS_PER_RESERVATION}")
_DURATION = Text(
    pattern=r"P(?=[0-9]|T[0-9])(?:[0-9]{1,4}W)?(?:[0-9]{1,5}D)?(?:T(?=[0-9])(?:[0-9]{1,6}H)?(?:[0-9]{1,8}M)?(?:[0-9]{1,9}S)?)?",
    max_length=40,
    reason="is not an ISO 8601 duration like 'PT8H' or 'P1DT12H' (weeks, days, hours, minutes, whole seconds)",
)
_MODEL = Text(
    pattern=r"[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,127}",
    reason="must be 1 to 128 of A-Z, a-z, 0-9, space and '._()/+-', starting with a letter or digit",
)
_PROFILE = Text(pattern=r"[0-9]{1,2}g\.[0-9]{1,4}gb(?:\+[a-z0-9]{1,8})?", reason="is not a MIG profile like '1g.10gb'")
_MEMORY = Integer(minimum=1, maximum=16 * 1024 * 1024, reason="must be between 1 and 16777216 MiB")
_KEY = Text(
    pattern=r"[\x21-\x7e]{1,255}", reason="must be 1 to 255 printable ASCII characters without spaces"
)  # as the Idempotency-Key header


def _parse_part(text: str, unit: str) -> int:
    head, sep, _ = text.partition(unit)
    return int(head) if sep else 0


def parse_duration(text: str) -> dt.timedelta:
    """The length an ISO 8601 duration the ``duration`` field's rule accepted stands for."""
    body = text[1:]
    days_part, _, time_part = body.partition("T")
    weeks = _parse_part(days_part, "W")
    days_part = days_part.split("W", 1)[1] if "W" in days_part else days_part
    days = _parse_part(days_part, "D")
    hours = _parse_part(time_part, "H")
    time_part = time_part.split("H", 1)[1] if "H" in time_part else time_part
    minutes = _parse_part(time_part, "M")
    time_part = time_part.split("M", 1)[1] if "M" in time_part else time_part
    seconds = _parse_part(time_part, "S")
    return dt.timedelta(weeks=weeks, days=days, hours=hours, minutes=minutes, seconds=seconds)


@attrs.frozen(kw_only=True)
class Constraints:
    """Which atoms fit. ``model``: a case-insensitive part of the GPU's model name; ``min_memory_mib``: the least
    memory per GPU (or per MIG slice); ``one_node``: all on one node; ``nvlink``: every GPU NVLink-connected to every
    other (so one node); ``mig_profile``: MIG slices of that profile instead of whole GPUs."""

    model: str | None = attrs.field(default=None, validator=_MODEL)
    min_memory_mib: int | None = attrs.field(default=None, validator=_MEMORY)
    one_node: bool = False
    nvlink: bool = False
    mig_profile: str | None = attrs.field(default=None, validator=_PROFILE)


@attrs.frozen(kw_only=True)
class CreateReservationInput:
    """Reserve ``gpus`` atoms of a pool from ``start_at`` (default now) to ``end_at``, or for ``duration``.

    ``idempotency_key`` has the ``Idempotency-Key`` header's meaning (give one or the other, or the same in both).
    """

    tenant: str = attrs.field(validator=_ID)
    pool_id: str = attrs.field(validator=_ID)
    gpus: int = attrs.field(validator=_GPUS)
    constraints: Constraints = attrs.field(factory=Constraints)
    start_at: dt.datetime | None = None
    end_at: dt.datetime | None = None
    duration: str | None = attrs.field(default=None, validator=_DURATION)
    idempotency_key: str | None = attrs.field(default=None, validator=_KEY)
    labels: dict[str, str] = attrs.field(factory=dict, validator=LABELS)


@attrs.frozen(kw_only=True)
class PlacedNode:
    """The atoms a reservation holds on one node: whole GPUs by UUID, or MIG slices by their UUID."""

    node_id: str
    atoms: tuple[str, ...]


@attrs.frozen(kw_only=True)
class Transition:
    """One step of a reservation's history: the state it entered, when, and why."""

    state: str
    at: dt.datetime
    reason: str | None = None


@attrs.frozen(kw_only=True)
class Reservation:
    """A reservation. ``placement`` is where its atoms are (empty before ``placed``); ``reason`` says why it is
    ``failed`` or ``cancelled``; ``history`` is every state it went through."""

    id: str
    tenant: str
    pool_id: str
    state: ReservationState
    gpus: int
    constraints: Constraints
    start_at: dt.datetime
    end_at: dt.datetime
    labels: dict[str, str]
    placement: tuple[PlacedNode, ...]
    reason: str | None
    history: tuple[Transition, ...]
    created_by: str
    created_at: dt.datetime
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class GetReservationInput:
    """A reservation by id."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListReservationsInput(PageInput):
    """A tenant's reservations, newest first, narrowed by state, pool, a time window they overlap
    (``[overlaps_start, overlaps_end)``, either end open) and a label (``key=value``)."""

    tenant: str = attrs.field(validator=_ID)
    state: ReservationState | None = None
    pool_id: str | None = attrs.field(default=None, validator=_ID)
    overlaps_start: dt.datetime | None = None
    overlaps_end: dt.datetime | None = None
    label: str | None = attrs.field(
        default=None,
        validator=Text(
            pattern=r"[^=\x00]{1,317}=[^=\x00]{0,63}", reason="must be 'key=value' (a label key, '=', its value)"
        ),
    )


@attrs.frozen(kw_only=True)
class ListReservationsOutput:
    """A page of reservations; ``next_cursor`` is null on the last page."""

    reservations: tuple[Reservation, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class CancelReservationInput:
    """Cancel a reservation that has not ended: its atoms are released now (a booking not yet started goes)."""

    id: str = attrs.field(validator=_ID)
    reason: str | None = attrs.field(
        default=None, validator=Text(pattern=r"[^\x00-\x1f\x7f]{1,256}", reason="must be 1 to 256 printable characters")
    )


@attrs.frozen(kw_only=True)
class ExtendReservationInput:
    """Move a reservation's end later, to ``end_at`` or by ``duration``; it succeeds only if its atoms stay free
    (and the quota allows)."""

    id: str = attrs.field(validator=_ID)
    end_at: dt.datetime | None = None
    duration: str | None = attrs.field(default=None, validator=_DURATION)


@attrs.frozen(kw_only=True)
class ExplainReservationInput:
    """Why a reservation was placed where it is."""

    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class Explanation:
    """Where a reservation was placed and why: the placer's rule, the nodes it chose with how many of their atoms
    were free, and how many candidate atoms it saw; for one that failed, its reason."""

    id: str
    state: ReservationState
    placer: str
    rule: str
    nodes: tuple[PlacedNode, ...]
    candidates: int
    free_on_chosen: dict[str, int]
    reason: str | None
