"""A clock that moves only when told: ``Options(clock=ManualClock(...))`` makes ``jobs.tick()`` reproducible."""

from __future__ import annotations

import datetime as dt

__all__ = ["ManualClock"]


class ManualClock:
    """``bettercompute.ports.Clock`` that stands still until ``advance`` or ``set``.

    Args:
        start: The initial time (timezone-aware); now, rounded down to the second, by default. With
            ``jobs.tick()``, start at or after the database's time (``ManualClock(await store.now())``) so that
            work enqueued without ``run_at`` (stamped with the database's now) is due.

    Raises:
        ValueError: ``start`` is naive.
    """

    def __init__(self, start: dt.datetime | None = None) -> None:
        start = start or dt.datetime.now(dt.UTC).replace(microsecond=0)
        if start.tzinfo is None:
            raise ValueError("a ManualClock needs a timezone-aware time")
        self._now = start.astimezone(dt.UTC)

    def now(self) -> dt.datetime:
        """The clock's time."""
        return self._now

    def advance(self, delta: dt.timedelta) -> dt.datetime:
        """Move forward by ``delta``; returns the new time."""
        self._now += delta
        return self._now

    def set(self, when: dt.datetime) -> None:
        """Jump to ``when`` (timezone-aware)."""
        if when.tzinfo is None:
            raise ValueError("a ManualClock needs a timezone-aware time")
        self._now = when.astimezone(dt.UTC)
