"""Pokes that wake background loops sooner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol

__all__ = ["SINKS_POKE", "WORK_CHANNEL", "Notifier"]

WORK_CHANNEL = "work"
"""The channel the worker loops listen on: payload ``kind,kind,...`` after work is enqueued, ``@members`` after a
membership change, ``SINKS_POKE`` when the ``sinks`` jobs have something to do. A store that enqueues or publishes
inside one statement of its own may poke it there."""
SINKS_POKE = "@sinks"
"""Events were committed to the outbox, or handed to subscribers that may have queued work (webhook deliveries)."""


class Notifier(Protocol):
    """Optional pokes that wake loops sooner. Loops must converge without them; a poke may be lost or repeated."""

    async def notify(self, channel: str, payload: str = "") -> None:
        """Send a poke; never raises for a missing listener."""
        ...

    def listen(self, channel: str) -> AbstractAsyncContextManager[AsyncIterator[str]]:
        """Receive pokes on ``channel`` while the context is open: every poke sent after it is entered."""
        ...
