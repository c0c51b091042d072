"""The usage module's jobs: accounting GPU-seconds per hour, and moving ended bookings to history (the module's
docstring tells how)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from bettercompute._runtime.jobs import Job, job_transaction
from bettercompute.modules.usage._port import BOOKINGS, USAGE_RECORDS

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = [
    "BOOKINGS_HISTORY",
    "HISTORY_BATCH",
    "HISTORY_BATCHES_PER_PASS",
    "HISTORY_MARGIN",
    "MAX_PERIODS_PER_PASS",
    "USAGE",
    "USAGE_GRACE",
    "USAGE_PERIOD",
    "account_usage",
    "move_ended_bookings",
]

USAGE_PERIOD = dt.timedelta(hours=1)
USAGE_GRACE = dt.timedelta(minutes=5)
"""How long after an hour ends it is accounted: transactions that book or release within it have committed."""
MAX_PERIODS_PER_PASS = 168
"""A pass accounts at most a week of hours; the next pass goes on from there."""


def _floor(at: dt.datetime) -> dt.datetime:
    seconds = USAGE_PERIOD.total_seconds()
    return dt.datetime.fromtimestamp((at.timestamp() // seconds) * seconds, dt.UTC)


async def account_usage(context: ModuleContext) -> int:
    """One pass of the usage job; returns how many usage records it wrote."""
    closed_until = _floor(context.clock.now() - USAGE_GRACE)
    async with job_transaction(context) as tx:
        watermark = await tx.repository(USAGE_RECORDS).accounted_until()
        if watermark is None:
            earliest = await tx.repository(USAGE_RECORDS).earliest_booking()
            start = _floor(earliest) if earliest is not None else closed_until
        elif watermark >= closed_until:
            return 0  # no hour closed since the last pass
        else:
            start = _floor(watermark) - USAGE_PERIOD  # the last hour again, in case a booking of it changed late
        end = min(closed_until, start + MAX_PERIODS_PER_PASS * USAGE_PERIOD)
        if end <= start:
            return 0
        return await tx.repository(USAGE_RECORDS).account(start=start, end=end, period=USAGE_PERIOD)


USAGE = Job(name="usage", role="controllers", interval=dt.timedelta(minutes=1), run=account_usage)
"""The usage job: a singleton of the ``controllers`` role (lease ``controllers/usage``)."""

HISTORY_MARGIN = dt.timedelta(hours=1)
"""How long after it ended a booking may leave the live bookings (once accounted, too). A moved booking no longer
refuses an overlapping one, and no reservation starts more than a minute in the past (clocks differ): an hour leaves
room for far worse clocks, and for a release recorded late."""
HISTORY_BATCH = 5_000
"""Bookings moved per statement (one short transaction each)."""
HISTORY_BATCHES_PER_PASS = 20
"""A pass moves at most this many batches; the next pass goes on from there."""


async def move_ended_bookings(context: ModuleContext) -> int:
    """One pass of the bookings-history job; returns how many bookings it moved.

    Each batch is one statement on its own (no lease fence: moving is safe to run twice at once, a booking is moved
    once), so a pass cancelled between batches keeps what it moved.
    """
    bookings = context.store.repository(BOOKINGS)
    moved = 0
    for _ in range(HISTORY_BATCHES_PER_PASS):
        n = await bookings.move_to_history(ended_by=context.clock.now() - HISTORY_MARGIN, limit=HISTORY_BATCH)
        moved += n
        if n < HISTORY_BATCH:
            break
    return moved


BOOKINGS_HISTORY = Job(
    name="bookings-history", role="controllers", interval=dt.timedelta(minutes=1), run=move_ended_bookings
)
"""The bookings-history job: a singleton of the ``controllers`` role (lease ``controllers/bookings-history``)."""
