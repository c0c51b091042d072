"""The commands module's logic: creating commands, and the CommandSweeper and SessionSweeper jobs (the module's
docstring tells what they do)."""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from bettercompute._runtime.jobs import Job, job_transaction
from bettercompute.errors import InvalidInputError
from bettercompute.modules.commands._port import (
    COMMANDS,
    SESSIONS,
    CommandRecord,
    LostSession,
)
from bettercompute.modules.nodes import NodeRecord, Signing, command_message, deadline_ms, lifecycle_item
from bettercompute.ports import OutboxEvent, Transaction, WorkItem

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = [
    "COMMAND_SWEEPER",
    "NODE_UNREACHABLE",
    "SESSION_CLOSED",
    "SESSION_OPENED",
    "SESSION_SWEEPER",
    "SWEEP_BATCH",
    "OnSessionLoss",
    "create_command",
    "ended_wakes",
    "sweep_commands",
    "sweep_sessions",
]

OnSessionLoss = Literal["redispatch", "fail"]
SESSION_OPENED = "node.session_opened"
"""Published by a gateway when a node's session opens (payload: node_id, epoch, gateway)."""
SESSION_CLOSED = "node.session_closed"
"""Published when a session ends (payload: node_id, epoch, gateway, reason: ``left``, the gateway's close reason, or
``gateway_lost`` from the SessionSweeper)."""
NODE_UNREACHABLE = "node.unreachable"
"""Published by the SessionSweeper, once per session, when a node has had no live session for the session timeout
(payload: node_id, epoch, gateway, last_seen_at)."""
SWEEP_BATCH = 500
"""How many commands one statement of a sweep settles; a pass repeats until a batch comes back short."""
_KIND = re.compile(r"[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*")


async def create_command(
    tx: Transaction,
    *,
    node: NodeRecord,
    kind: str,
    payload: Mapping[str, Any],
    deadline: dt.datetime,
    on_session_loss: OnSessionLoss = "fail",
    max_attempts: int = 3,
    wake: WorkItem | None = None,
    signer: Signing | None,
) -> CommandRecord:
    """Create a ``pending`` command for ``node`` in ``tx`` (it becomes visible when ``tx`` commits), signed by
    ``signer`` (``prepared_signer``, loaded before ``tx``; ``None`` only where node identity is off). Its deadline is
    kept in whole milliseconds, as it is signed.

    ``wake`` (``reconciler.item(key)``) is enqueued in the transaction that ends the command (its result recorded,
    its deadline passed, its session lost for good), so the controller waiting for it runs again at once.

    Raises:
        InvalidInputError: a kind that is not a dotted lower-case name, an unknown ``on_session_loss``, or
            ``max_attempts`` outside 1..100.
    """
    if len(kind) > 128 or not _KIND.fullmatch(kind):
        raise InvalidInputError("kind: a dotted lower-case name like 'diag.nvml'", details={"path": "kind"})
    if on_session_loss not in ("redispatch", "fail"):
        raise InvalidInputError("on_session_loss: redispatch or fail", details={"path": "on_session_loss"})
    if not 1 <= max_attempts <= 100:
        raise InvalidInputError("max_attempts: between 1 and 100", details={"path": "max_attempts"})
    try:
        arguments = json.dumps(dict(payload), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise InvalidInputError("payload: a JSON object", details={"path": "payload"}) from None
    command_id = f"cmd_{secrets.token_hex(10)}"
    deadline = deadline.replace(microsecond=deadline.microsecond // 1000 * 1000)
    message = command_message(
        command_id=command_id,
        node_id=node.id,
        kind=kind,
        arguments_json=arguments,
        deadline_ms=deadline_ms(deadline),
    )
    return await tx.repository(COMMANDS).create(
        id=command_id,
        node_id=node.id,
        tenant=node.tenant,
        kind=kind,
        payload=json.loads(arguments),
        deadline=deadline,
        on_session_loss=on_session_loss,
        max_attempts=max_attempts,
        wake=wake,
        arguments_json=arguments,
        instruction=signer.sign(message) if signer is not None else None,
    )


def ended_wakes(commands: Sequence[CommandRecord]) -> list[WorkItem]:
    """The wake-up work items of the commands among ``commands`` that have ended (not those sent back to pending)."""
    return [c.wake for c in commands if c.wake is not None and c.state not in ("pending", "dispatched")]


def _event(command: CommandRecord) -> OutboxEvent:
    kind = {"expired": "command.expired", "failed": "command.failed", "pending": "command.requeued"}[command.state]
    payload = {
        "command_id": command.id,
        "node_id": command.node_id,
        "tenant": command.tenant,
        "kind": command.kind,
        "state": command.state,
        "reason": command.reason,
        "attempts": command.attempts,
    }
    return OutboxEvent(type=kind, key=command.id, payload=payload)


async def sweep_commands(context: ModuleContext) -> int:
    """One pass of the CommandSweeper; returns how many commands it changed."""
    changed = 0
    while True:
        now = context.clock.now()
        async with job_transaction(context) as tx:
            expired = await tx.repository(COMMANDS).expire(now=now, limit=SWEEP_BATCH)
            orphaned = await tx.repository(COMMANDS).orphaned(
                stale_before=now - context.session_timeout, now=now, limit=SWEEP_BATCH
            )
            settled = sorted([*expired, *orphaned], key=lambda c: c.id)
            if settled:
                await tx.publish([_event(c) for c in settled])
                wakes = ended_wakes(settled)
                if wakes:
                    await tx.enqueue(wakes)
        changed += len(settled)
        if len(expired) < SWEEP_BATCH and len(orphaned) < SWEEP_BATCH:
            return changed


COMMAND_SWEEPER = Job(name="command-sweeper", role="controllers", interval=dt.timedelta(seconds=1), run=sweep_commands)
"""The CommandSweeper: a singleton of the ``controllers`` role (lease ``controllers/command-sweeper``)."""


def _lost_events(lost: LostSession) -> list[OutboxEvent]:
    if lost.retired:
        return []
    base = {"node_id": lost.node_id, "epoch": lost.epoch, "gateway": lost.gateway}
    events = []
    if lost.closed_by_sweep:
        events.append(OutboxEvent(type=SESSION_CLOSED, key=lost.node_id, payload={**base, "reason": "gateway_lost"}))
    payload = {**base, "last_seen_at": lost.last_seen_at.isoformat()}
    events.append(OutboxEvent(type=NODE_UNREACHABLE, key=lost.node_id, payload=payload))
    return events


async def sweep_sessions(context: ModuleContext) -> int:
    """One pass of the SessionSweeper; returns how many nodes it found unreachable."""
    found = 0
    while True:
        now = context.clock.now()
        async with job_transaction(context) as tx:
            lost = await tx.repository(SESSIONS).unreachable(
                stale_before=now - context.session_timeout, now=now, limit=SWEEP_BATCH
            )
            events = [e for one in lost for e in _lost_events(one)]
            if events:
                await tx.publish(events)
            wakes = [lifecycle_item(one.node_id) for one in lost if not one.retired]
            if wakes:
                await tx.enqueue(wakes)  # the lifecycle controller marks them unreachable
        found += len(lost)
        if len(lost) < SWEEP_BATCH:
            return found


SESSION_SWEEPER = Job(name="session-sweeper", role="controllers", interval=dt.timedelta(seconds=2), run=sweep_sessions)
"""The SessionSweeper: a singleton of the ``controllers`` role (lease ``controllers/session-sweeper``)."""
