"""Inputs and outputs of the ``quotas`` and ``capacity`` groups.

Field rules are declared with ``bettercompute.fields``: the codec enforces them (``INVALID_INPUT`` at the field's
path) and the OpenAPI document publishes them. The capacity window starts at ``start`` (``from`` is a Python
keyword) and lasts ``days``.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

import attrs

from bettercompute.fields import Integer, Number, Text
from bettercompute.paging import PageInput

__all__ = [
    "MAX_DAYS",
    "MAX_GPUS",
    "MAX_GPU_HOURS_PER_MONTH",
    "Capacity",
    "CapacityDay",
    "EffectiveQuota",
    "GetCapacityInput",
    "GetQuotaInput",
    "ListQuotasInput",
    "ListQuotasOutput",
    "ModelCapacity",
    "Quota",
    "QuotaSource",
    "SetQuotaInput",
]

MAX_GPUS = 1_000_000
"""The largest ``max_gpus`` a quota may hold (a million GPUs in one pool is beyond any real pool)."""
MAX_GPU_HOURS_PER_MONTH = MAX_GPUS * 744
"""The largest ``max_gpu_hours_per_month``: ``MAX_GPUS`` busy for a 31-day month."""
DEFAULT_DAYS = 7
MAX_DAYS = 31

QuotaSource = Literal["tenant", "pool_default", "unlimited"]

_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_DAYS = Integer(minimum=1, maximum=MAX_DAYS, reason=f"must be between 1 and {MAX_DAYS} days")
_MAX_GPUS = Integer(minimum=0, maximum=MAX_GPUS, reason=f"must be between 0 and {MAX_GPUS} (null: unlimited)")
_MAX_HOURS = Number(
    minimum=0,
    maximum=MAX_GPU_HOURS_PER_MONTH,
    reason=f"must be between 0 and {MAX_GPU_HOURS_PER_MONTH} GPU-hours (null: unlimited)",
)

_MAX_LENGTH = Integer(minimum=1, maximum=720, reason="must be between 1 and 720 hours (null: 30 days)")


@attrs.frozen(kw_only=True)
class SetQuotaInput:
    """A pool's quota for a tenant, or with ``tenant`` null the pool's default (for every tenant without a row of its
    own). ``max_gpus`` caps the GPUs the tenant holds at once, ``max_gpu_hours_per_month`` the GPU-hours it books in
    a calendar month (UTC); null is unlimited. ``max_reservation_hours`` is the longest one reservation may last (the
    pool default's row: the pool's maximum; null: 30 days). Setting replaces every limit of the row."""

    pool_id: str = attrs.field(validator=_ID)
    tenant: str | None = attrs.field(default=None, validator=_ID)
    max_gpus: int | None = attrs.field(default=None, validator=_MAX_GPUS)
    max_gpu_hours_per_month: float | None = attrs.field(default=None, validator=_MAX_HOURS)
    max_reservation_hours: int | None = attrs.field(default=None, validator=_MAX_LENGTH)


@attrs.frozen(kw_only=True)
class Quota:
    """A quota row of a pool; ``tenant`` null is the pool's default."""

    pool_id: str
    tenant: str | None
    max_gpus: int | None
    max_gpu_hours_per_month: float | None
    max_reservation_hours: int | None
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class GetQuotaInput:
    """The quota that applies to a tenant in a pool."""

    pool_id: str = attrs.field(validator=_ID)
    tenant: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class EffectiveQuota:
    """The limits that apply to ``tenant`` in the pool and where they come from: the tenant's own row
    (``tenant``), the pool's default (``pool_default``), or neither (``unlimited``, both limits null)."""

    pool_id: str
    tenant: str
    max_gpus: int | None
    max_gpu_hours_per_month: float | None
    max_reservation_hours: int | None
    source: QuotaSource


@attrs.frozen(kw_only=True)
class ListQuotasInput(PageInput):
    """A pool's quota rows, one page at a time."""

    pool_id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class ListQuotasOutput:
    """A page of the pool's quota rows, the default (if set) first and then by tenant; ``next_cursor`` is null on
    the last page."""

    quotas: tuple[Quota, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class GetCapacityInput:
    """A pool's capacity now, and what is booked over a window of ``days`` days (1 to 31, default 7) from ``start``
    (default now). A length rather than an end: every window the document allows is one the method answers."""

    pool_id: str = attrs.field(validator=_ID)
    start: dt.datetime | None = None
    days: int = attrs.field(default=DEFAULT_DAYS, validator=_DAYS)


@attrs.frozen(kw_only=True)
class CapacityDay:
    """GPU-hours booked in one UTC day (clipped to the window), in all and per GPU model."""

    day: dt.datetime
    gpu_hours: float
    by_model: dict[str, float]


@attrs.frozen(kw_only=True)
class ModelCapacity:
    """The pool's atoms of one GPU model (``unknown`` when the node did not say)."""

    model: str
    atoms: int
    available: int
    free: int
    booked: int
    booked_gpus: float
    unavailable: dict[str, int]
    gpu_hours: float


@attrs.frozen(kw_only=True)
class Capacity:
    """A pool's atoms (whole GPUs and MIG slices) at ``at``: how many there are, how many are ``available`` (their
    node and device are fit), how many are ``free`` (available and not booked now), how many are ``booked`` now and
    the GPUs those bookings hold, and the unavailable ones by reason (``unknown`` without one). ``gpu_hours`` is
    what is booked over ``[start, end)``, and ``days`` splits it per UTC day for a calendar; ``models`` has the same
    per GPU model."""

    pool_id: str
    at: dt.datetime
    start: dt.datetime
    end: dt.datetime
    atoms: int
    available: int
    free: int
    booked: int
    booked_gpus: float
    unavailable: dict[str, int]
    gpu_hours: float
    days: tuple[CapacityDay, ...]
    models: tuple[ModelCapacity, ...]
