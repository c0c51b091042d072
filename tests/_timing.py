"""How long the tests wait: one factor for every deadline in the suite, for slow or busy machines.

A test that waits for a process, a server or a fleet waits for the condition and gives up only at a deadline, and
every such deadline goes through ``deadline()``: set ``BETTERCOMPUTE_TEST_SLOWDOWN=3`` and each is three times as
long, pytest-timeout's per-test limit too (``tests/conftest.py``). The factor never shortens a wait that succeeds:
it only moves the point at which a test gives up, so an idle machine runs exactly as fast with any factor.

Durations that are part of what a test asserts (a lease TTL, "nothing happens within a second", "faster than the
next cycle") are not deadlines and are not scaled.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable

import anyio

__all__ = ["SLOW", "SLOWDOWN_ENV", "deadline", "eventually", "wait_until"]

SLOWDOWN_ENV = "BETTERCOMPUTE_TEST_SLOWDOWN"


def _slowdown() -> float:
    raw = os.environ.get(SLOWDOWN_ENV, "").strip() or "1"
    try:
        factor = float(raw)
    except ValueError:
        raise RuntimeError(f"{SLOWDOWN_ENV} must be a number, not {raw!r}") from None
    if not factor >= 1:
        raise RuntimeError(f"{SLOWDOWN_ENV} must be 1 or more (it only lengthens deadlines), not {raw!r}")
    return factor


SLOW: float = _slowdown()
"""The factor every deadline is multiplied by (``BETTERCOMPUTE_TEST_SLOWDOWN``, 1 when unset)."""


def deadline(seconds: float) -> float:
    """How long to wait for something that takes at most ``seconds`` on an idle machine before failing the test."""
    return seconds * SLOW


def wait_until(check: Callable[[], object], within: float, what: str, *, every: float = 0.1) -> None:
    """Call ``check`` until it returns something true; fail naming ``what`` after ``deadline(within)`` seconds.

    ``check`` may itself assert (that a process is still alive, say): its failure ends the wait at once.
    """
    limit = deadline(within)
    ends = time.monotonic() + limit
    while not check():
        assert time.monotonic() < ends, f"not within {limit:.0f} s: {what}"
        time.sleep(every)


async def eventually(check: Callable[[], Awaitable[object]], within: float, what: str, *, every: float = 0.1) -> None:
    """``wait_until`` for a coroutine ``check``, sleeping on the event loop between calls."""
    limit = deadline(within)
    ends = anyio.current_time() + limit
    while not await check():
        assert anyio.current_time() < ends, f"not within {limit:.0f} s: {what}"
        await anyio.sleep(every)
