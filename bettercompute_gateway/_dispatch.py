"""Commands sent down the sessions: each pass takes the pending commands of every live session at once."""

from __future__ import annotations

import json

import bettercompute_proto as wire
from bettercompute.modules.commands import EDGE
from bettercompute.ports import Store

from ._sessions import Sessions
from ._signers import SignerCertificates
from ._wire import ms

__all__ = ["CommandDispatch"]


class CommandDispatch:
    """Sends the sessions' pending commands, noting on each session what was sent (its results are checked
    against it)."""

    def __init__(self, store: Store, sessions: Sessions, signers: SignerCertificates) -> None:
        self._store = store
        self._sessions = sessions
        self._signers = signers

    async def dispatch(self) -> None:
        """Send the sessions' pending commands: one statement takes them for every session at once, dated by the
        database's clock (a command past its deadline there is not sent)."""
        live = self._sessions.live()
        if not live:
            return
        commands = await self._store.repository(EDGE).dispatch([(s.node_id, s.epoch) for s in live.values()], limit=16)
        for command in commands:
            session = live[command.node_id]
            session.commands[command.id] = command.kind
            # Sent as the control plane signed it: the exact arguments' text, the signature and the key's certificate.
            arguments = command.arguments_json
            frame = wire.Command(
                id=command.id,
                kind=command.kind,
                arguments_json=arguments if arguments is not None else json.dumps(dict(command.payload)),
                deadline_ms=ms(command.deadline.timestamp()),
                signature=self._signers.signature(command.instruction),
                signer_certificate=await self._signers.certificate(command.instruction),
            )
            # A session that cannot take it ends; the sweeper settles the command as its ``on_session_loss`` says.
            self._sessions.deliver(session, wire.ControlFrame(command=frame))
