"""The usage job: GPU-seconds per tenant and pool, from bookings, per hour.

A singleton job of the ``controllers`` role (lease ``controllers/usage``). Each pass accounts the hours that closed
at least ``USAGE_GRACE`` ago and were not accounted yet (at most ``MAX_PERIODS_PER_PASS`` of them), plus the last
hour accounted before, again, in case a booking of it changed late. Accounting an hour recomputes it from the
bookings and replaces its records, and the watermark moves in the same fenced transaction: a pass that crashes,
runs twice or runs again over the same hours never counts anything twice.

A booking counts ``gpus`` times the seconds of it inside the hour (``gpus`` is 1 for a GPU, a fraction for a MIG
slice, 0 for vCPU and memory units); a booking without an end counts up to the end of the hour.

The bookings-history job (lease ``controllers/bookings-history``) moves bookings that ended before the accounting
watermark and at least ``HISTORY_MARGIN`` ago out of the live bookings, whose overlap index degrades under churn
(DESIGN §12), a bounded batch per statement. Readers of ended bookings read history too, so accounting, booked
GPU-hours and quota sums give the same numbers before and after a move.
"""

from bettercompute.modules.usage._module import UsageModule as UsageModule
from bettercompute.modules.usage._port import BOOKINGS as BOOKINGS
from bettercompute.modules.usage._port import USAGE_RECORDS as USAGE_RECORDS
from bettercompute.modules.usage._port import Booking as Booking
from bettercompute.modules.usage._port import Bookings as Bookings
from bettercompute.modules.usage._port import Usage as Usage
from bettercompute.modules.usage._port import UsageRecord as UsageRecord
from bettercompute.modules.usage._service import BOOKINGS_HISTORY as BOOKINGS_HISTORY
from bettercompute.modules.usage._service import HISTORY_BATCH as HISTORY_BATCH
from bettercompute.modules.usage._service import HISTORY_BATCHES_PER_PASS as HISTORY_BATCHES_PER_PASS
from bettercompute.modules.usage._service import HISTORY_MARGIN as HISTORY_MARGIN
from bettercompute.modules.usage._service import MAX_PERIODS_PER_PASS as MAX_PERIODS_PER_PASS
from bettercompute.modules.usage._service import USAGE as USAGE
from bettercompute.modules.usage._service import USAGE_GRACE as USAGE_GRACE
from bettercompute.modules.usage._service import USAGE_PERIOD as USAGE_PERIOD
from bettercompute.modules.usage._service import account_usage as account_usage
from bettercompute.modules.usage._service import move_ended_bookings as move_ended_bookings

__all__ = [
    "BOOKINGS",
    "BOOKINGS_HISTORY",
    "HISTORY_BATCH",
    "HISTORY_BATCHES_PER_PASS",
    "HISTORY_MARGIN",
    "MAX_PERIODS_PER_PASS",
    "USAGE",
    "USAGE_GRACE",
    "USAGE_PERIOD",
    "USAGE_RECORDS",
    "Booking",
    "Bookings",
    "Usage",
    "UsageModule",
    "UsageRecord",
    "account_usage",
    "move_ended_bookings",
]
