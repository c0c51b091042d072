"""Pokes that wake background loops sooner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol

__all__ = ["Notifier"]


class Notifier(Protocol):
    """Optional pokes that wake loops sooner. Loops must converge without them; a poke may be lost or repeated."""

    async def notify(self, channel: str, payload: str = "") -> None:
        """Send a poke; never raises for a missing listener."""
        ...

    def listen(self, channel: str) -> AbstractAsyncContextManager[AsyncIterator[str]]:
        """Receive pokes on ``channel`` while the context is open: every poke sent after it is entered."""
        ...
