"""Sessions whose certificate was revoked (a node revoked or retired) or has expired are closed, one statement for
all sessions each pass, so a revocation ends its session within about two flush intervals whatever happens to
events."""

from __future__ import annotations

import logging

from bettercompute import Metrics
from bettercompute.modules.commands import EDGE
from bettercompute.ports import Clock, Store

from ._sessions import Sessions

__all__ = ["RevocationWatch"]

log = logging.getLogger("bettercompute.gateway")


class RevocationWatch:
    """Closes the sessions whose certificate is no longer good."""

    def __init__(self, store: Store, sessions: Sessions, clock: Clock, metrics: Metrics) -> None:
        self._store = store
        self._sessions = sessions
        self._clock = clock
        self._applied = metrics.gateway_revocations_applied

    async def check(self) -> None:
        """Close the sessions whose certificate expired, then those whose certificate was revoked."""
        sessions = {s.serial: s for s in self._sessions.by_node.values() if s.closing is None}
        if not sessions:
            return
        # A session lives no longer than the certificate it opened with; the daemon renewed it meanwhile and opens
        # its next session with the new one.
        now = self._clock.now().timestamp()
        for session in [s for s in sessions.values() if s.not_after <= now]:
            log.info("node %s: the certificate of session %d expired, closing it", session.node_id, session.epoch)
            await self._sessions.close(session, "certificate_expired", "the session's certificate expired; reconnect")
            del sessions[session.serial]
        for serial in await self._store.repository(EDGE).revoked_among(list(sessions)):
            session = sessions[serial]
            log.info("node %s: certificate %s revoked, closing its session", session.node_id, serial)
            self._applied.inc()
            await self._sessions.close(session, "revoked", "the node's certificate was revoked")
