"""In-process subscribers of committed events (``compute.events``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection

from bettercompute.ports import OutboxEvent, StoredEvent

__all__ = ["Events", "Subscriber"]


Subscriber = Callable[[StoredEvent], Awaitable[None]]


class Events:
    """In-process subscribers of committed events. A subscriber runs only after the event's transaction commits,
    at least once, in per-key order; an exception makes the event come back later."""

    def __init__(self) -> None:
        self._subscribers: list[tuple[frozenset[str] | None, Subscriber]] = []

    def subscribe(self, subscriber: Subscriber, *, types: Collection[str] | None = None) -> Callable[[], None]:
        """Call ``subscriber`` for committed events (of ``types`` only, when given); returns an unsubscribe."""
        entry = (frozenset(types) if types is not None else None, subscriber)
        self._subscribers.append(entry)

        def unsubscribe() -> None:
            if entry in self._subscribers:
                self._subscribers.remove(entry)

        return unsubscribe

    @staticmethod
    def event(type: str, key: str, **payload: object) -> OutboxEvent:
        """An event to publish with ``Transaction.publish``."""
        return OutboxEvent(type=type, key=key, payload=payload)

    async def deliver(self, event: StoredEvent) -> None:
        """Hand one event to every matching subscriber."""
        for types, subscriber in list(self._subscribers):
            if types is None or event.type in types:
                await subscriber(event)
