"""The HTTP front's load shedder: ``max_in_flight`` calls run at once, at most ``max_queued`` wait their turn in
arrival order, and a call that finds both full is shed at once with ``503 UNAVAILABLE`` and ``Retry-After``.

Why a bound on the queue, and why by default as long as ``max_in_flight``: a process serves calls at some rate ``X``
with ``max_in_flight`` of them running. A call that joins a queue of ``n`` waits until ``n`` calls ahead of it have
finished, about ``n / X`` seconds; with ``n = max_in_flight`` that is about one service time (the time ``max_in_flight``
running calls take to finish, which is what a call takes at saturation). So an admitted call takes at most about two
service times, however many more arrive: the rest are answered at once instead of queueing without bound, where
each extra waiter only adds to every later call's latency and, past the client's timeout, turns into work nobody
reads. A longer queue absorbs longer bursts at the cost of that latency; ``0`` sheds as soon as every slot is busy.
The bound is a count rather than a time because a count scales with the service time by itself (Little's law), while
a fixed wait would have to be tuned per method and per machine.

The shed answer promises that nothing of the call ran (it is decided before authentication, before any database
work and, over ASGI, before the body is read), so a client may send it again whatever the method: ``retry_delay``
reads that promise (``details.reason == "overloaded"``) and the ``Retry-After`` header, for the typed client and the
command line alike.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

import anyio

__all__ = [
    "OVERLOADED",
    "RETRY_AFTER_SECONDS",
    "LoadShedder",
    "Presence",
    "retry_delay",
]

OVERLOADED = "overloaded"
"""``details.reason`` of a shed call's ``UNAVAILABLE``: nothing of it ran, so it may be sent again as it was."""

RETRY_AFTER_SECONDS = 1
"""The ``Retry-After`` of a shed call. A queue drains in about one service time (milliseconds); a second, the least
the header can say in whole seconds, leaves the burst time to pass, and clients add jitter (``retry_delay``)."""

_WAITING, _ADMITTED, _GONE = 0, 1, 2


class _Waiter:
    __slots__ = ("event", "state")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.state = _WAITING


class Presence:
    """Whether the client of one request is still there, as its transport sees it: a call that waits for a slot and
    whose client leaves gives its place up (``leave()``) instead of running for nobody."""

    __slots__ = ("_admission", "_waiter", "left")

    def __init__(self) -> None:
        self.left = False
        self._admission: LoadShedder | None = None
        self._waiter: _Waiter | None = None

    def leave(self) -> None:
        """The client disconnected: if its call is still waiting, it leaves the queue (a running call runs on)."""
        self.left = True
        if self._admission is not None and self._waiter is not None:
            self._admission._abandon(self._waiter)


PRESENCE: ContextVar[Presence | None] = ContextVar("bettercompute_presence", default=None)
"""The ``Presence`` of the request the current task serves, set by a transport that can tell (ASGI); unset, a
waiting call waits until admitted."""


class LoadShedder:
    """Slots for calls in flight and a bounded FIFO queue in front of them.

    ``acquire()`` takes a slot (waiting in the queue when there is room) or says the call is shed; every ``True``
    from it is paired with one ``release()``, which hands the slot to the oldest waiter. Single event loop only.

    Attributes:
        max_in_flight: Calls running at once.
        max_queued: Calls waiting at once, at most.
        in_flight: Calls running now.
        waiting: Calls waiting now.
        shed: Calls shed since the start.
        peak_waiting: The most calls that have waited at once.
    """

    __slots__ = ("_queue", "in_flight", "max_in_flight", "max_queued", "peak_waiting", "shed", "waiting")

    def __init__(self, max_in_flight: int, max_queued: int) -> None:
        self.max_in_flight = max_in_flight
        self.max_queued = max_queued
        self.in_flight = 0
        self.waiting = 0
        self.shed = 0
        self.peak_waiting = 0
        self._queue: collections.deque[_Waiter] = collections.deque()

    @property
    def full(self) -> bool:
        """Whether a call arriving now would be shed."""
        return self.in_flight >= self.max_in_flight and self.waiting >= self.max_queued

    @property
    def busy(self) -> bool:
        """Whether a call arriving now would wait (or be shed): every slot is taken."""
        return self.in_flight >= self.max_in_flight

    async def acquire(self) -> bool:
        """A slot for one call: ``True`` once it holds one; ``False`` at once when the queue is full, or when the
        client left (``PRESENCE``) before a slot came. Cancelled while waiting, it leaves the queue."""
        if self.in_flight < self.max_in_flight and not self._queue:
            self.in_flight += 1
            return True
        presence = PRESENCE.get()
        if self.waiting >= self.max_queued or (presence is not None and presence.left):
            self.shed += 1
            return False
        waiter = _Waiter()
        self._queue.append(waiter)
        self.waiting += 1
        self.peak_waiting = max(self.peak_waiting, self.waiting)
        if presence is not None:
            presence._admission, presence._waiter = self, waiter
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.state == _ADMITTED:
                self.release()  # handed a slot as the cancellation came: pass it on
            else:
                self._abandon(waiter)
            raise
        finally:
            if presence is not None:
                presence._admission, presence._waiter = None, None
        return waiter.state == _ADMITTED

    def release(self) -> None:
        """Give back the slot of an ``acquire()`` that returned ``True``: to the oldest waiter, else free."""
        if self._queue:
            waiter = self._queue.popleft()
            self.waiting -= 1
            waiter.state = _ADMITTED
            waiter.event.set()  # the slot passes to it: in_flight stays
            return
        self.in_flight -= 1

    def _abandon(self, waiter: _Waiter) -> None:
        if waiter.state != _WAITING:
            return  # admitted already (its call runs on) or gone
        waiter.state = _GONE
        self._queue.remove(waiter)  # at most max_queued long
        self.waiting -= 1
        waiter.event.set()


def retry_delay(status: int, headers: Mapping[str, str], payload: Any) -> float | None:
    """Seconds to wait before sending a call again that the server shed (``503``, ``UNAVAILABLE`` with reason
    ``overloaded``, ``Retry-After`` in whole seconds); ``None`` for any other answer, which must not be resent
    blindly. The server's figure is a floor: callers add jitter so that the shed ones do not come back together."""
    if status != 503:
        return None
    value = headers.get("retry-after", "").strip()
    if not value.isascii() or not value.isdigit() or len(value) > 6:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict) or error.get("code") != "UNAVAILABLE":
        return None
    details = error.get("details")
    if not isinstance(details, dict) or details.get("reason") != OVERLOADED:
        return None
    return float(int(value))
