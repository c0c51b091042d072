"""Session epochs in the control plane: each session a node opens takes its next epoch (``Sessions.open``), and its
end is recorded once, with the events that say so."""

from __future__ import annotations

from bettercompute.modules.commands import EDGE
from bettercompute.ports import Store

from ._sessions import Session

__all__ = ["Epochs"]


class Epochs:
    """Opens and closes the session records of the nodes this gateway (``gateway``) holds."""

    def __init__(self, store: Store, *, gateway: str) -> None:
        self._edge = store.repository(EDGE)
        self._gateway = gateway

    async def open(self, node_id: str) -> int:
        """Open the node's next session here (which publishes ``node.session_opened`` and has the lifecycle
        controller take note that the node is reachable again); its epoch."""
        return await self._edge.open_session(node_id=node_id, gateway=self._gateway)

    async def close(self, session: Session) -> None:
        """Record that a session ended, which publishes ``node.session_closed`` with why (``left``: the daemon ended
        it; ``superseded`` when a newer session replaced it); nothing twice for a session closed already."""
        await self._edge.close_session(
            node_id=session.node_id, epoch=session.epoch, gateway=self._gateway, reason=session.closing or "left"
        )
