"""Idempotency keys for mutating methods: a retry with the same key gets the first answer instead of a second change.

A key is scoped to the principal that sent it and to the method. The request is compared by a fingerprint: SHA-256 of
the method's path and the input's canonical JSON, leaving out the fields an input hides from its ``repr`` (a
secret's value is never stored, not even hashed, so a retry that changes only such a field replays the first
answer). The first call with a key reserves it, runs, and stores its answer; later calls with the same key and
fingerprint:

- replay the stored answer while it is kept (``IDEMPOTENCY_TTL``, 24 hours from the first call);
- wait while the first is still running (at most ``WAIT``, then ``UNAVAILABLE``, retryable), then replay it;
- get ``CONFLICT`` (reason ``idempotency_key_reused``) when the fingerprint differs.

A method whose answer holds a one-time secret (declared ``replayable=False``: ``join-tokens.create``,
``webhooks.create``, ``credentials.create``) stores only the new resource's id: a retry is told ``CONFLICT``
(reason ``already_done``, with that ``id``) instead of receiving the secret a second time. A call that fails gives
its key back, so the retry runs again. If the process stops between the change's commit and the answer's storing,
the key stays reserved until it expires and retries are answered ``UNAVAILABLE``: nothing is done twice.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import attrs

from bettercompute.errors import ConflictError, InvalidInputError, UnavailableError
from bettercompute.ports import IdempotencyKeys

__all__ = ["IDEMPOTENCY_TTL", "WAIT", "checked_key", "fingerprint", "once"]

IDEMPOTENCY_TTL = dt.timedelta(hours=24)
"""How long a key's answer is kept (and the key bound to its first request)."""
WAIT = 10.0
"""How long a call waits, in seconds, for a concurrent call with the same key to finish."""
_POLL = 0.05
_KEY = re.compile(r"[\x21-\x7e]{1,255}")


def checked_key(key: object) -> str:
    """``key`` when it is 1 to 255 printable ASCII characters without spaces.

    Raises:
        InvalidInputError: anything else (``details["path"] == "Idempotency-Key"``).
    """
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise InvalidInputError(
            "the idempotency key must be 1 to 255 printable ASCII characters without spaces",
            details={"path": "Idempotency-Key", "reason": "malformed idempotency key"},
        )
    return key


def fingerprint(path: str, input: Any, wire: Mapping[str, Any]) -> str:
    """The request's fingerprint: its method path and its input's JSON, without the fields hidden from ``repr``."""
    hidden = {f.name for f in attrs.fields(type(input)) if not f.repr} if attrs.has(type(input)) else set()
    shown = {k: v for k, v in wire.items() if k not in hidden}
    text = json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(f"{path}\n{text}".encode()).hexdigest()


def _resource_id(wire: Any) -> str | None:
    """The id a creating method's answer names: its ``id``, or the ``id`` of an object it holds."""
    if not isinstance(wire, Mapping):
        return None
    if isinstance(wire.get("id"), str):
        return str(wire["id"])
    for value in wire.values():
        if isinstance(value, Mapping) and isinstance(value.get("id"), str):
            return str(value["id"])
    return None


async def once(
    keys: IdempotencyKeys,
    *,
    identity: str,
    key: str,
    request: str,
    replayable: bool,
    run: Callable[[], Awaitable[Any]],
) -> tuple[bool, Any]:
    """Run ``run`` (which returns the answer's JSON) at most once for ``key``: ``(True, json)`` when it ran now,
    ``(False, json)`` when the answer is a replay.

    Raises:
        ConflictError: the key was used for another request, or its answer is not replayable.
        UnavailableError: a call with the key is still running (or stopped before storing its answer).
    """
    with anyio.move_on_after(WAIT):
        while True:
            outcome = await keys.begin(identity=identity, key=key, request_hash=request, ttl=IDEMPOTENCY_TTL)
            if outcome.state == "new":
                break
            if outcome.state == "conflict":
                raise ConflictError(
                    "this idempotency key was used for another request",
                    details={"reason": "idempotency_key_reused", "path": "Idempotency-Key"},
                )
            if outcome.state == "replay":
                stored = dict(outcome.result or {})
                if stored.get("replayable") is False:
                    raise ConflictError(
                        "a request with this idempotency key succeeded before; its answer held a one-time secret,"
                        " which is not kept",
                        details={"reason": "already_done", "id": stored.get("id")},
                    )
                return False, stored.get("output")
            await anyio.sleep(_POLL)
    if outcome.state != "new":
        raise UnavailableError(
            "a request with this idempotency key is still running; retry later",
            details={"reason": "idempotency_key_in_use", "retryable": True},
        )
    try:
        wire = await run()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await keys.abandon(identity=identity, key=key)
        raise
    stored = {"output": wire} if replayable else {"replayable": False, "id": _resource_id(wire)}
    with anyio.CancelScope(shield=True):
        await keys.finish(identity=identity, key=key, result=stored)
    return True, wire
