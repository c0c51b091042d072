"""The transactional outbox of committed events."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

__all__ = ["Outbox", "OutboxEvent", "StoredEvent"]


@attrs.frozen(kw_only=True)
class OutboxEvent:
    """An event to publish once the transaction that records it commits. Events of one ``key`` keep their order."""

    type: str
    key: str
    payload: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class StoredEvent:
    """An outbox event as stored: ``seq`` numbers the events of one key in commit order, from 1."""

    id: int
    type: str
    key: str
    seq: int
    payload: Mapping[str, Any]
    created_at: dt.datetime
    token: str


class Outbox(Protocol):
    """Committed events, handed out in per-key order.

    An event is visible only after its transaction commits. For one key, events are numbered in commit order; an
    event is not handed out while an earlier event of its key is undelivered.
    """

    async def claim(self, *, holder: str, limit: int, claim_for: dt.timedelta) -> list[StoredEvent]:
        """Claim up to ``limit`` deliverable events, at most one per key, oldest first."""
        ...

    async def ack(self, events: Sequence[StoredEvent]) -> int:
        """Mark claimed events delivered; returns how many were still held by these claims."""
        ...

    async def release(self, events: Sequence[StoredEvent], *, delay: dt.timedelta) -> int:
        """Hand claimed events back undelivered, deliverable again after ``delay``."""
        ...
