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

Sessions are opened and closed by gateways, which publish ``node.session_opened`` and ``node.session_closed`` (with
the reason). The SessionSweeper (lease ``controllers/session-sweeper``) announces ``node.unreachable`` once per
session when a node's last session has been quiet for ``Options.session_timeout`` with no newer one: closed by its
gateway (the daemon left, timed out, was refused) or still open because its gateway died; such an open session is
closed by the sweep (``node.session_closed`` with reason ``gateway_lost``). A retired node is not announced.
"""

from bettercompute.modules.commands._edge import EDGE as EDGE
from bettercompute.modules.commands._edge import Edge as Edge
from bettercompute.modules.commands._edge import SignedAck as SignedAck
from bettercompute.modules.commands._module import CommandsModule as CommandsModule
from bettercompute.modules.commands._port import COMMANDS as COMMANDS
from bettercompute.modules.commands._port import SESSIONS as SESSIONS
from bettercompute.modules.commands._port import CommandRecord as CommandRecord
from bettercompute.modules.commands._port import Commands as Commands
from bettercompute.modules.commands._port import LostSession as LostSession
from bettercompute.modules.commands._port import SessionRecord as SessionRecord
from bettercompute.modules.commands._port import Sessions as Sessions
from bettercompute.modules.commands._service import COMMAND_SWEEPER as COMMAND_SWEEPER
from bettercompute.modules.commands._service import NODE_UNREACHABLE as NODE_UNREACHABLE
from bettercompute.modules.commands._service import SESSION_CLOSED as SESSION_CLOSED
from bettercompute.modules.commands._service import SESSION_OPENED as SESSION_OPENED
from bettercompute.modules.commands._service import SESSION_SWEEPER as SESSION_SWEEPER
from bettercompute.modules.commands._service import SWEEP_BATCH as SWEEP_BATCH
from bettercompute.modules.commands._service import OnSessionLoss as OnSessionLoss
from bettercompute.modules.commands._service import create_command as create_command
from bettercompute.modules.commands._service import ended_wakes as ended_wakes
from bettercompute.modules.commands._service import sweep_commands as sweep_commands
from bettercompute.modules.commands._service import sweep_sessions as sweep_sessions

__all__ = [
    "COMMANDS",
    "COMMAND_SWEEPER",
    "EDGE",
    "NODE_UNREACHABLE",
    "SESSIONS",
    "SESSION_CLOSED",
    "SESSION_OPENED",
    "SESSION_SWEEPER",
    "SWEEP_BATCH",
    "CommandRecord",
    "Commands",
    "CommandsModule",
    "Edge",
    "LostSession",
    "OnSessionLoss",
    "SessionRecord",
    "Sessions",
    "SignedAck",
    "create_command",
    "ended_wakes",
    "sweep_commands",
    "sweep_sessions",
]
