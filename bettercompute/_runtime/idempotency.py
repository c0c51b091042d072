"""Idempotency keys for mutating methods: a retry with the same key gets the first answer instead of a second change.

A key belongs to the principal that sent it (one key names one request of that principal, whatever the method: the
same key on another method is ``CONFLICT``). The request is compared by a fingerprint: SHA-256 of the method's path
and the input's canonical JSON, leaving out the top-level fields an input hides from its ``repr`` (a secret's value is
never stored, not even hashed, so a retry that changes only such a field replays the first answer). The first call
with a key reserves it, runs, and stores its answer; later calls with the same key and fingerprint:

- replay the stored answer while it is kept (``IDEMPOTENCY_TTL``, 24 hours from the first call; a ``controllers``
  job deletes expired keys);
- wait while the first is still running (at most ``WAIT`` between polls, then ``UNAVAILABLE``, retryable), then
  replay it;
- get ``CONFLICT`` (reason ``idempotency_key_reused``) when the fingerprint differs.

A method whose answer holds a one-time secret (declared ``replayable=False``: ``join-tokens.create``,
``webhooks.create``, ``credentials.create``) stores only the new resource's id: a retry is told ``CONFLICT``
(reason ``already_done``, with that id) instead of receiving the secret a second time. A call that fails before its
change commits gives its key back, so the retry runs again; one that fails (or whose caller gives up) after its
``call.transaction()`` committed keeps the key, and a retry is told ``already_done`` with the id, never making the
change twice. If the process stops between the commit and the answer's storing, the key stays reserved until it
expires and retries are answered ``UNAVAILABLE``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

import anyio
import attrs

from bettercompute.errors import ComputeError, ConflictError, InvalidInputError, UnavailableError
from bettercompute.ports import IdempotencyKeys

__all__ = [
    "IDEMPOTENCY_TTL",
    "WAIT",
    "IdempotentRequest",
    "checked_key",
    "fingerprint",
    "once",
    "remember",
    "replayed",
    "request_of",
    "reserve",
]

log = logging.getLogger("bettercompute.idempotency")

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


_BODY_KEY = "idempotency_key"
"""An input field of this name is the request's idempotency key given in the body (``reservations.create``): it
names the request rather than being part of it."""


def fingerprint(path: str, input: Any, wire: Mapping[str, Any]) -> str:
    """The request's fingerprint: its method path and its input's JSON, without the fields hidden from ``repr`` and
    without an ``idempotency_key`` field."""
    hidden = {f.name for f in attrs.fields(type(input)) if not f.repr} if attrs.has(type(input)) else set()
    shown = {k: v for k, v in wire.items() if k not in hidden and k != _BODY_KEY}
    text = json.dumps(shown, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(f"{path}\n{text}".encode()).hexdigest()


@attrs.frozen(kw_only=True)
class IdempotentRequest:
    """One call's idempotency: whose key (``identity``, a principal), the key, and the request's ``fingerprint``."""

    identity: str
    key: str
    fingerprint: str


def request_of(
    *, identity: str | None, path: str, input: Any, header: str | None, encode: Callable[[Any], Mapping[str, Any]]
) -> IdempotentRequest | None:
    """The call's idempotency, from the ``Idempotency-Key`` header (already checked by ``checked_key``) or the
    input's own ``idempotency_key`` field; ``None`` without either, or without a caller to own the key. ``encode``
    gives the input's JSON, asked only when there is a key to fingerprint.

    Raises:
        InvalidInputError: the header and the field name different keys.
    """
    body = getattr(input, _BODY_KEY, None)
    if isinstance(body, str):
        if header is not None and header != body:
            reason = "differs from the Idempotency-Key header"
            raise InvalidInputError(f"{_BODY_KEY}: {reason}", details={"path": _BODY_KEY, "reason": reason})
        header = body
    if header is None or identity is None:
        return None
    return IdempotentRequest(identity=identity, key=header, fingerprint=fingerprint(path, input, encode(input)))


class _Begun(Protocol):
    @property
    def state(self) -> str: ...
    @property
    def result(self) -> Mapping[str, Any] | None: ...


B = TypeVar("B", bound=_Begun)


async def reserve(begin: Callable[[], Awaitable[B]]) -> B:
    """Call ``begin`` (a store's ``begin``: the key's reservation, alone or with a module's first write) until its
    outcome settles, waiting at most ``WAIT`` for a call with the same key that is still running.

    Returns the outcome when it is neither ``conflict`` nor ``in_progress``: ``new`` (or a module's own, such as
    ``drafted``) to go on, ``replay`` to answer ``result`` (see ``replayed``).

    Raises:
        ConflictError: the key was used for another request (reason ``idempotency_key_reused``).
        UnavailableError: a call with the key is still running (reason ``idempotency_key_in_use``, retryable).
    """
    deadline = anyio.current_time() + WAIT
    while True:
        outcome = await begin()
        if outcome.state == "conflict":
            raise ConflictError(
                "this idempotency key was used for another request",
                details={"reason": "idempotency_key_reused", "path": "Idempotency-Key"},
            )
        if outcome.state != "in_progress":
            return outcome
        if anyio.current_time() >= deadline:
            raise UnavailableError(
                "a request with this idempotency key is still running; retry later",
                details={"reason": "idempotency_key_in_use", "retryable": True},
            )
        await anyio.sleep(_POLL)


def replayed(stored: Mapping[str, Any] | None) -> Any:
    """The answer a stored result replays (its ``output``).

    Raises:
        ConflictError: the answer was not kept (it held a one-time secret, or was lost after the change committed);
            reason ``already_done`` with the id the change made.
    """
    found = dict(stored or {})
    if found.get("replayable") is False:
        raise ConflictError(
            "a request with this idempotency key succeeded before; its answer is not kept (it held a"
            " one-time secret, or was lost after the change committed)",
            details={"reason": "already_done", "id": found.get("id")},
        )
    return found.get("output")


def _resource_id(wire: Any) -> str | None:
    """The id a creating method's answer names: its ``id`` (a tunnel's answer: ``tunnel_id``), or the ``id`` of an
    object it holds."""
    if not isinstance(wire, Mapping):
        return None
    for name in ("id", "tunnel_id"):
        if isinstance(wire.get(name), str):
            return str(wire[name])
    for value in wire.values():
        if isinstance(value, Mapping) and isinstance(value.get("id"), str):
            return str(value["id"])
    return None


async def once(
    keys: IdempotencyKeys,
    request: IdempotentRequest,
    *,
    replayable: bool,
    run: Callable[[], Awaitable[Any]],
    committed: Callable[[], str | None],
) -> tuple[bool, Any]:
    """Run ``run`` (which returns the answer's JSON) at most once for ``key``: ``(True, json)`` when it ran now,
    ``(False, json)`` when the answer is a replay.

    ``committed()`` tells whether the call's change has committed (and the id it names), even if ``run`` then
    failed: such a key is never given back, so a retry is told the change was made instead of making it twice.

    Raises:
        ConflictError: the key was used for another request, or its answer is not replayable.
        UnavailableError: a call with the key is still running (or stopped before storing its answer).
    """
    identity, key = request.identity, request.key
    outcome = await reserve(
        lambda: keys.begin(identity=identity, key=key, request_hash=request.fingerprint, ttl=IDEMPOTENCY_TTL)
    )
    if outcome.state == "replay":
        return False, replayed(outcome.result)
    try:
        wire = await run()
    except BaseException:
        with anyio.CancelScope(shield=True):
            done = committed()
            try:
                if done is None:
                    await keys.abandon(identity=identity, key=key)
                else:
                    # The change committed and its answer is lost: a retry hears it was done, with its id.
                    await keys.finish(identity=identity, key=key, result={"replayable": False, "id": done})
            except ComputeError:
                log.warning("the idempotency key of a failed call could not be settled; it stays reserved")
        raise
    await remember(keys, request, wire if replayable else None, made=_resource_id(wire))
    return True, wire


async def remember(keys: IdempotencyKeys, request: IdempotentRequest, wire: Any, *, made: str | None = None) -> None:
    """Store the answer (``wire``) that retries with ``request``'s key replay; with ``wire`` ``None``, only the id the
    change ``made`` (an answer with a one-time secret is never kept). Shielded from cancellation, and a failure is
    logged, never raised: the change committed and its caller gets its answer."""
    stored = {"output": wire} if wire is not None else {"replayable": False, "id": made}
    with anyio.CancelScope(shield=True):
        try:
            await keys.finish(identity=request.identity, key=request.key, result=stored)
        except ComputeError as exc:
            log.warning("the answer of an idempotent call could not be stored (%s); its key keeps", exc.code)
