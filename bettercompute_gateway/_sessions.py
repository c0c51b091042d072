"""The sessions a gateway holds, in memory: one per node, and how a frame reaches one or one is closed.

Closing a session sends ``Close`` with its reason, then wakes the session's own task, which waits a little for the
daemon to end its side before the stream ends with a status: ending first would reset the stream, and a reset can
overtake the ``Close`` frame.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any

import attrs
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from grpclib.exceptions import StreamTerminatedError
from grpclib.server import Stream

import bettercompute_proto as wire

__all__ = ["MAX_QUEUED", "Session", "Sessions"]

MAX_QUEUED = 32
"""How many frames from the flush loop may wait for one slow daemon before its session is closed as ``slow``."""


@attrs.define(eq=False)
class Session:
    """One node's session on this gateway."""

    node_id: str
    epoch: int
    serial: str
    public_key: Any
    stream: Stream[Any, Any]
    task: asyncio.Task[Any] | None
    closing: str | None = None
    sends: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    commands: dict[str, str] = attrs.field(factory=dict)  # dispatched on this session: id -> kind
    sent_generation: int | None = None  # the desired-state generation sent; None until first looked up
    queued: int = 0  # frames from the flush loop waiting to be sent
    not_after: float = float("inf")  # when the session's certificate expires (seconds since the epoch)
    events: int = 0  # events taken in the current minute
    events_since: float = 0.0

    @property
    def public_key_der(self) -> bytes:
        """The session certificate's public key as SubjectPublicKeyInfo (DER), relayed with what the node signs."""
        der: bytes = self.public_key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        return der


class Sessions:
    """The session table: node id -> its session (``by_node``), the nodes heard from since the last liveness write
    (``heard``), and sending to and closing sessions."""

    def __init__(self, *, send_timeout: float) -> None:
        self.by_node: dict[str, Session] = {}
        self.heard: set[str] = set()  # swapped for an empty set by each liveness write
        self._send_timeout = send_timeout
        self.spawned: set[asyncio.Future[None]] = set()  # frames and closes under way without a waiter

    def live_one(self, node_id: str) -> Session | None:
        """The node's session here, unless it is closing."""
        session = self.by_node.get(node_id)
        return session if session is not None and session.closing is None else None

    def live(self) -> dict[str, Session]:
        """Node id -> session, for every session not closing."""
        return {s.node_id: s for s in self.by_node.values() if s.closing is None}

    async def send(self, session: Session, frame: wire.ControlFrame) -> None:
        """Send a frame, or close the session as ``slow`` when the daemon does not read it in time (HTTP/2 flow
        control holds a frame back while the daemon's window is full).

        Raises:
            StreamTerminatedError: the session was closed as ``slow``.
        """
        try:
            async with asyncio.timeout(self._send_timeout):
                async with session.sends:
                    await session.stream.send_message(frame)
        except TimeoutError:
            await self.close(session, "slow", "the daemon did not read its frames in time")
            raise StreamTerminatedError("the daemon did not read its frames") from None

    def deliver(self, session: Session, frame: wire.ControlFrame) -> None:
        """Send a frame from the flush loop without waiting for it: a daemon that reads slowly delays only its own
        frames (in order), never the loop or other sessions; past ``MAX_QUEUED`` frames waiting it is closed."""
        if session.closing is not None:
            return
        if session.queued >= MAX_QUEUED:
            self.spawn(self.close(session, "slow", "the daemon did not read its frames in time"))
            return
        session.queued += 1
        self.spawn(self._deliver_one(session, frame))

    async def _deliver_one(self, session: Session, frame: wire.ControlFrame) -> None:
        try:
            with contextlib.suppress(Exception):  # a session that cannot take it ends
                await self.send(session, frame)
        finally:
            session.queued -= 1

    def spawn(self, work: Awaitable[None]) -> None:
        """Run ``work`` without waiting for it; the gateway cancels what is left when it closes."""
        task = asyncio.ensure_future(work)
        self.spawned.add(task)
        task.add_done_callback(self.spawned.discard)

    async def close(self, session: Session, reason: str, message: str) -> None:
        """Send ``Close`` (best effort) and end the session; from another task (a newer session, a revocation, the
        gateway closing) the session's task is woken from its read to end the stream."""
        if session.closing is not None:
            return
        session.closing = reason
        close = wire.ControlFrame(close=wire.Close(reason=reason, message=message))
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                async with session.sends:
                    await session.stream.send_message(close)
        if session.task is not None and session.task is not asyncio.current_task():
            session.task.cancel()  # wakes its read; it then ends the stream normally, after the Close frame
