"""The ``usage`` module object: its repositories and its two jobs."""

from __future__ import annotations

from bettercompute._runtime.declarations import StaticModule
from bettercompute._version import __version__
from bettercompute.modules.usage._port import BOOKINGS, USAGE_RECORDS
from bettercompute.modules.usage._service import BOOKINGS_HISTORY, USAGE

__all__ = ["UsageModule"]


def UsageModule() -> StaticModule:
    """The ``usage`` module: GPU-seconds accounted from bookings (no group of methods yet)."""
    return StaticModule(
        name="usage",
        version=__version__,
        core_range=f"=={__version__}",
        jobs=(USAGE, BOOKINGS_HISTORY),
        repositories=(
            BOOKINGS,
            USAGE_RECORDS,
        ),
    )
