"""Idempotency keys: a stored result per identity and key."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

__all__ = ["IdempotencyKeys", "IdempotencyOutcome"]


@attrs.frozen(kw_only=True)
class IdempotencyOutcome:
    """What ``IdempotencyKeys.begin`` found.

    ``state`` is ``"new"`` (the key is now reserved for this request), ``"replay"`` (the same request finished
    before: ``result`` holds its stored result), ``"in_progress"`` (the same request is running elsewhere) or
    ``"conflict"`` (the key was used for a different request).
    """

    state: str
    result: Mapping[str, Any] | None = None


class IdempotencyKeys(Protocol):
    """Idempotency keys: per identity, a key is bound to the hash of the first request made with it."""

    async def begin(self, *, identity: str, key: str, request_hash: str, ttl: dt.timedelta) -> IdempotencyOutcome:
        """Reserve ``key`` for this request, or report what an earlier use of it left (see ``IdempotencyOutcome``)."""
        ...

    async def finish(self, *, identity: str, key: str, result: Mapping[str, Any]) -> None:
        """Store the result that later uses of the key replay."""
        ...

    async def abandon(self, *, identity: str, key: str) -> None:
        """Forget a reservation whose request failed, so the key may be used again."""
        ...

    async def purge(self, *, limit: int = 10_000) -> int:
        """Delete up to ``limit`` expired keys; returns how many."""
        ...
