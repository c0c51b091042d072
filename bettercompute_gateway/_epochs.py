"""Session epochs in the control plane: each session a node opens takes its next epoch (``Sessions.open``), and its
end is recorded once, with the events that say so."""

from __future__ import annotations

from bettercompute.modules.commands import SESSION_CLOSED, SESSION_OPENED, SESSIONS
from bettercompute.modules.nodes import lifecycle_item
from bettercompute.ports import OutboxEvent, Store

from ._sessions import Session

__all__ = ["Epochs"]


class Epochs:
    """Opens and closes the session records of the nodes this gateway (``gateway``) holds."""

    def __init__(self, store: Store, *, gateway: str) -> None:
        self._store = store
        self._gateway = gateway

    async def open(self, node_id: str) -> int:
        """Open the node's next session here and publish ``node.session_opened``; its epoch."""
        async with self._store.transaction() as tx:
            record = await tx.repository(SESSIONS).open(node_id=node_id, gateway=self._gateway)
            payload = {"node_id": node_id, "epoch": record.epoch, "gateway": self._gateway}
            await tx.publish([OutboxEvent(type=SESSION_OPENED, key=node_id, payload=payload)])
            await tx.enqueue([lifecycle_item(node_id)])  # reachable again: the lifecycle controller takes note
        return record.epoch

    async def close(self, session: Session) -> None:
        """Record that a session ended, and publish ``node.session_closed`` with why (``left``: the daemon ended it;
        ``superseded`` when a newer session replaced it); nothing twice for a session closed already."""
        async with self._store.transaction() as tx:
            current = await tx.repository(SESSIONS).close(node_id=session.node_id, epoch=session.epoch)
            if current or session.closing == "superseded":
                payload = {
                    "node_id": session.node_id,
                    "epoch": session.epoch,
                    "gateway": self._gateway,
                    "reason": session.closing or "left",
                }
                await tx.publish([OutboxEvent(type=SESSION_CLOSED, key=session.node_id, payload=payload)])
            if current:
                await tx.enqueue([lifecycle_item(session.node_id)])  # ``Reachable`` turns false; the timeout runs
