"""Commands to nodes and the daemon sessions they are sent on."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.modules.nodes import InstructionSignature, SignedFact
from bettercompute.ports import Repository, WorkItem

__all__ = ["COMMANDS", "SESSIONS", "CommandRecord", "Commands", "LostSession", "SessionRecord", "Sessions"]


@attrs.frozen(kw_only=True)
class CommandRecord:
    """A command for a node's daemon (``diag.nvml``, ``reboot``, ...).

    ``state``: ``pending`` (waiting for the node's session), ``dispatched`` (sent on session ``session_epoch``, which
    a finished command keeps as the session it was last sent on),
    then ``succeeded``, ``failed``, ``expired`` (its ``deadline`` passed first) or ``cancelled``. ``on_session_loss``
    says what happens when the session it was dispatched on dies: ``redispatch`` (back to ``pending``, at most
    ``max_attempts`` dispatches in all) or ``fail``. ``reason`` is machine-readable (``deadline_exceeded``,
    ``session_lost``, ``attempts_exhausted``, or the daemon's).
    """

    id: str
    node_id: str
    tenant: str
    kind: str
    payload: Mapping[str, Any]
    state: str
    on_session_loss: str
    deadline: dt.datetime
    attempts: int
    max_attempts: int
    session_epoch: int | None
    dispatched_at: dt.datetime | None
    result: Mapping[str, Any] | None
    reason: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    wake: WorkItem | None = None
    """The work item to enqueue when the command ends (succeeded, failed or expired), so the controller that asked
    for it hears of the outcome at once."""
    result_json: str | None = None
    """The result as the node signed it (``result`` is parsed from it); ``None`` for a command without one."""
    signed: SignedFact | None = None
    """The node's signature over the result (``command_result_message``), checked by whoever uses the result."""
    arguments_json: str | None = None
    """``payload`` as the exact JSON text the control plane signed (what a gateway sends)."""
    instruction: InstructionSignature | None = None
    """The control plane's signature over the command (``command_message``); ``None`` where node identity is off."""


@attrs.frozen(kw_only=True)
class SessionRecord:
    """A node's daemon session on a gateway: ``epoch`` grows with every session the node opens; the session is
    live while it is not closed and was seen recently."""

    node_id: str
    epoch: int
    gateway: str
    opened_at: dt.datetime
    last_seen_at: dt.datetime
    closed_at: dt.datetime | None


@attrs.frozen(kw_only=True)
class LostSession:
    """A node found unreachable by ``Sessions.unreachable``: its last session, whether that session was still open
    (and so closed by the sweep: its gateway went away), and whether the node is retired (then nothing is announced).
    """

    node_id: str
    epoch: int
    gateway: str
    last_seen_at: dt.datetime
    closed_by_sweep: bool
    retired: bool


class Commands(Protocol):
    """Commands for daemons; state changes are guarded by the state they leave, so a repeated or concurrent call
    changes nothing twice.

    ``create``, ``expire`` and ``orphaned`` need a transaction (``tx.repository(COMMANDS)``); the others also run on
    their own (``store.repository(COMMANDS)``).
    """

    async def create(
        self,
        *,
        id: str,
        node_id: str,
        tenant: str,
        kind: str,
        payload: Mapping[str, Any],
        deadline: dt.datetime,
        on_session_loss: str,
        max_attempts: int,
        wake: WorkItem | None = None,
        arguments_json: str | None = None,
        instruction: InstructionSignature | None = None,
    ) -> CommandRecord:
        """Add a ``pending`` command (``wake``: the work item to enqueue when it ends; ``arguments_json`` and
        ``instruction``: the payload's text and the control plane's signature over the command)."""
        ...

    async def get(self, id: str) -> CommandRecord | None:
        """A command by id."""
        ...

    async def dispatch(self, *, node_id: str, epoch: int, now: dt.datetime, limit: int) -> list[CommandRecord]:
        """Mark up to ``limit`` of the node's ``pending`` commands, oldest first, ``dispatched`` on session ``epoch``
        (counting an attempt) and return them; commands past their deadline are left to the sweeper."""
        ...

    async def finish(
        self, *, id: str, epoch: int, state: str, result: Mapping[str, Any], reason: str | None
    ) -> CommandRecord | None:
        """Record the outcome (``succeeded`` or ``failed``) of a command dispatched on session ``epoch``; ``None``
        when it is not dispatched on that epoch any more (expired, re-dispatched, finished already)."""
        ...

    async def expire(self, *, now: dt.datetime, limit: int) -> list[CommandRecord]:
        """Turn up to ``limit`` open (``pending`` or ``dispatched``) commands whose deadline passed by ``now`` into
        ``expired`` (reason ``deadline_exceeded``); returns them as they are now."""
        ...

    async def orphaned(self, *, stale_before: dt.datetime, now: dt.datetime, limit: int) -> list[CommandRecord]:
        """Settle up to ``limit`` ``dispatched`` commands whose session died (closed, replaced by a newer epoch,
        gone, or not seen since ``stale_before``): back to ``pending`` when they declare ``redispatch`` and have
        attempts left, else ``failed`` (``session_lost`` or ``attempts_exhausted``). Returns them as they are now."""
        ...


class Sessions(Protocol):
    """Daemon sessions, as gateways report them."""

    async def open(self, *, node_id: str, gateway: str) -> SessionRecord:
        """Start a session of the node on ``gateway`` with the node's next epoch (``nodes.session_epoch`` + 1);
        any earlier session of the node is over from then on."""
        ...

    async def seen(self, alive: Sequence[tuple[str, int]], *, gateway: str) -> list[str]:
        """Record that these sessions (node id, epoch) held by ``gateway`` are alive, in one statement whatever their
        number; returns the node ids whose session was still current (not closed, not replaced, not given up by
        the SessionSweeper)."""
        ...

    async def close(self, *, node_id: str, epoch: int) -> bool:
        """End the session ``epoch`` of the node (a no-op once a newer one opened)."""
        ...

    async def get(self, node_id: str) -> SessionRecord | None:
        """The node's latest session."""
        ...

    async def unreachable(self, *, stale_before: dt.datetime, now: dt.datetime, limit: int) -> list[LostSession]:
        """Mark up to ``limit`` nodes unreachable, once per session: their latest session was last seen before
        ``stale_before`` and, if it was closed, was closed before then too (no newer session since). A session still
        open (its gateway died or lost the database) is closed at ``now``. Needs a transaction; a new session of the
        node (``open``) clears the mark."""
        ...


COMMANDS: Repository[Commands] = Repository(module="commands", name="commands")
"""``tx.repository(COMMANDS)`` in a transaction, ``store.repository(COMMANDS)`` outside one: the store's ``Commands``"""
SESSIONS: Repository[Sessions] = Repository(module="commands", name="sessions")
"""``tx.repository(SESSIONS)`` in a transaction, ``store.repository(SESSIONS)`` outside one: the store's ``Sessions``"""
