"""Desired states pushed down the sessions: each poll reads the changes since the last one (one indexed statement),
a notifier poke reads them at once, and a periodic sweep compares every session's generation with its node's."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import time

import bettercompute_proto as wire
from bettercompute.modules.commands import EDGE
from bettercompute.modules.nodes import DESIRED_STATE_CHANNEL, DesiredState
from bettercompute.ports import Notifier, Store

from ._sessions import Session, Sessions
from ._signers import SignerCertificates

__all__ = ["DesiredPush"]

log = logging.getLogger("bettercompute.gateway")

_DESIRED_LOOKBACK = 30.0
"""How far back (seconds) each poll of changed desired states reaches: a change whose transaction committed up to
this long after it was dated is still seen; the full comparison every ``desired_sweep_interval`` catches the rest."""
_NEVER = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)


class DesiredPush:
    """Sends each live session its node's desired state whenever its generation is newer than the one sent."""

    def __init__(
        self, store: Store, sessions: Sessions, signers: SignerCertificates, *, gateway: str, sweep_interval: float
    ) -> None:
        self._store = store
        self._signers = signers
        self._gateway = gateway
        self._sessions = sessions
        self._sweep_interval = sweep_interval
        self._lock = asyncio.Lock()
        self._since: dt.datetime | None = None
        self._sweep_at = 0.0

    async def listen(self, notifier: Notifier) -> None:
        """Push desired states as soon as a poke says one changed; reconnect with backoff (polling covers the
        gaps, so nothing is lost while this is down)."""
        delay = 1.0
        while True:
            try:
                async with notifier.listen(DESIRED_STATE_CHANNEL) as pokes:
                    delay = 1.0
                    async for _ in pokes:
                        with contextlib.suppress(Exception):
                            await self.push()
            except Exception as exc:
                log.info("desired-state pokes not heard (%s); polling meanwhile", type(exc).__name__)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def push(self) -> None:
        """Send each live session the node's desired state when its generation is newer than the one sent: the
        changes dated since the last read (one indexed statement), the new sessions' current ones, and every
        ``sweep_interval`` a comparison for all sessions (one statement each)."""
        async with self._lock:
            nodes = self._store.repository(EDGE)
            # The first read only learns the database's time: the sessions' own lookups cover what came before.
            changed, read_at = await nodes.desired_since(self._since or _NEVER, gateway=self._gateway)
            self._since = read_at - dt.timedelta(seconds=_DESIRED_LOOKBACK)
            live = self._sessions.live()
            now = time.monotonic()
            if now >= self._sweep_at:
                self._sweep_at = now + self._sweep_interval
                asked = list(live.values())
            else:
                asked = [s for s in live.values() if s.sent_generation is None]
            if asked:
                changed += await nodes.desired_newer(
                    [(s.node_id, s.sent_generation or 0) for s in asked], gateway=self._gateway
                )
            for session in asked:
                if session.sent_generation is None:
                    session.sent_generation = 0
            for desired in sorted(changed, key=lambda d: d.generation):
                target = live.get(desired.node_id)
                if target is not None and desired.generation > (target.sent_generation or 0):
                    await self._send(target, desired)

    async def _send(self, session: Session, desired: DesiredState) -> None:
        # As the control plane signed it: the exact text, the signature and the signing key's certificate.
        text = desired.text if desired.text is not None else json.dumps(dict(desired.content), separators=(",", ":"))
        frame = wire.DesiredState(
            generation=desired.generation,
            content_json=text,
            signature=self._signers.signature(desired.instruction),
            signer_certificate=await self._signers.certificate(desired.instruction),
        )
        session.sent_generation = desired.generation  # a session that cannot take it ends; its next one gets it
        self._sessions.deliver(session, wire.ControlFrame(desired_state=frame))
