"""Commands for node daemons, and the CommandSweeper that ends the ones no daemon will answer.

A command is created ``pending`` for a node (in the transaction of the change that needs it). The gateway holding
the node's session dispatches it on that session (``dispatch`` of ``store.repository(COMMANDS)``) and records the
daemon's result (``finish``). The sweeper, a singleton job of the ``controllers`` role under the lease
``controllers/command-sweeper``, makes sure no command waits forever:

- a command whose ``deadline`` passed becomes ``expired`` (reason ``deadline_exceeded``), pending or dispatched;
- a command dispatched on a session that died (closed, replaced by a newer session of the node, or not reported
  alive by its gateway for ``Options.session_timeout``) goes back to ``pending`` when it declares
  ``on_session_loss="redispatch"`` and has dispatches left, and otherwise becomes ``failed`` (``session_lost``, or
  ``attempts_exhausted`` once ``max_attempts`` dispatches were spent).

Each change is published, in the same transaction, as ``command.expired``, ``command.failed`` or
``command.requeued`` (key: the command id), and the sweeper's writes are fenced by its lease.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from bettercompute._runtime.declarations import StaticModule
from bettercompute._runtime.jobs import Job, job_transaction
from bettercompute._version import __version__
from bettercompute.errors import InvalidInputError
from bettercompute.modules.commands._port import COMMANDS, SESSIONS, CommandRecord, Commands, SessionRecord, Sessions
from bettercompute.modules.nodes._port import NodeRecord
from bettercompute.ports import OutboxEvent, Transaction

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = [
    "COMMANDS",
    "COMMAND_SWEEPER",
    "SESSIONS",
    "SWEEP_BATCH",
    "CommandRecord",
    "Commands",
    "CommandsModule",
    "OnSessionLoss",
    "SessionRecord",
    "Sessions",
    "create_command",
    "sweep_commands",
]

OnSessionLoss = Literal["redispatch", "fail"]
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
) -> CommandRecord:
    """Create a ``pending`` command for ``node`` in ``tx`` (it becomes visible when ``tx`` commits).

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
    return await tx.repository(COMMANDS).create(
        id=f"cmd_{secrets.token_hex(10)}",
        node_id=node.id,
        tenant=node.tenant,
        kind=kind,
        payload=payload,
        deadline=deadline,
        on_session_loss=on_session_loss,
        max_attempts=max_attempts,
    )


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
        changed += len(settled)
        if len(expired) < SWEEP_BATCH and len(orphaned) < SWEEP_BATCH:
            return changed


COMMAND_SWEEPER = Job(name="command-sweeper", role="controllers", interval=dt.timedelta(seconds=1), run=sweep_commands)
"""The CommandSweeper: a singleton of the ``controllers`` role (lease ``controllers/command-sweeper``)."""


def CommandsModule() -> StaticModule:
    """The ``commands`` module: commands to node daemons and their sweeper (no group of methods yet)."""
    return StaticModule(
        name="commands",
        version=__version__,
        core_range=f"=={__version__}",
        jobs=(COMMAND_SWEEPER,),
        repositories=(
            COMMANDS,
            SESSIONS,
        ),
    )
