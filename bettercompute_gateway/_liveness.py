"""Liveness, written in batches: once a ``liveness_flush_interval``, one statement marks every session heard from
since the last write (``Sessions.seen``), whatever their number, and a session the control plane no longer counts
as current is closed. The same pass runs the gateway's other periodic work after it; whether the pass reached the
database is what the health service says."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from bettercompute.modules.commands import EDGE
from bettercompute.ports import Store

from ._health import Health
from ._sessions import Sessions

__all__ = ["Liveness"]

log = logging.getLogger("bettercompute.gateway")


class Liveness:
    """The flush loop: liveness each pass, then ``steps`` (acknowledgements, revocations, commands, desired states)
    in order; a pass that fails leaves its work to the next."""

    def __init__(
        self,
        store: Store,
        sessions: Sessions,
        health: Health,
        *,
        gateway: str,
        interval: float,
        steps: Sequence[Callable[[], Awaitable[None]]],
    ) -> None:
        self._store = store
        self._sessions = sessions
        self._health = health
        self._gateway = gateway
        self._interval = interval
        self._steps = steps

    async def run(self) -> None:
        """A pass every ``interval`` until cancelled."""
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.flush()
                for step in self._steps:
                    await step()  # the last reads the database every pass: it is the health probe too
                self._health.database(ok=True)
            except Exception as exc:  # a database outage: the next pass does what this one missed
                self._health.database(ok=False)
                log.warning("liveness or revocations not handled: %s", type(exc).__name__)

    async def flush(self) -> None:
        """Write that the sessions heard from since the last flush are alive: one statement for all of them."""
        sessions = self._sessions
        heard, sessions.heard = sessions.heard, set()
        alive = [(node_id, s.epoch) for node_id in heard if (s := sessions.by_node.get(node_id)) is not None]
        if not alive:
            return
        try:
            current = set(await self._store.repository(EDGE).seen(alive, gateway=self._gateway))
        except BaseException:
            sessions.heard |= heard
            raise
        # A session the database no longer counts as current (the SessionSweeper gave it up while this gateway
        # could not report it, or the node is gone) is closed: the daemon's next session starts clean.
        for node_id, epoch in alive:
            session = sessions.by_node.get(node_id)
            if node_id not in current and session is not None and session.epoch == epoch:
                sessions.spawn(sessions.close(session, "stale", "the control plane no longer counts this session"))
