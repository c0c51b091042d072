"""A daemon's ``Session`` stream, from admission to its end.

In order: a client certificate is required (the handshake verified its chain against the trust bundle); the first
frame must be ``Hello`` within ``hello_timeout``; the certificate must be current for a live node (the control
plane's ``node_of``: not expired, chaining to the bundle, issued here, not revoked, role ``node``, node not retired)
and its node id must be the one in ``Hello``. Then the node's next epoch is taken (``Epochs.open``), an older
session of the node on this gateway is closed (``superseded``), ``Welcome`` carries the epoch and the heartbeat
interval, and inventory is asked for. Frames then flow until the daemon ends the stream, stays silent for three
heartbeat intervals (``timeout``), or the gateway closes it. Each frame marks the node heard from; the flush loop
writes that (``Liveness``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

import betterproto2
from cryptography import x509
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.server import Stream

import bettercompute_proto as wire
from bettercompute import Metrics
from bettercompute.errors import ComputeError, InvalidInputError, UnauthenticatedError, UnavailableError

from ._epochs import Epochs
from ._errors import grpc_error
from ._health import Health
from ._ingest import Ingest
from ._options import GatewayOptions
from ._port import GatewayServicesPort
from ._sessions import Session, Sessions
from ._wire import client_certificate, ms, receive

__all__ = ["SessionStream"]

log = logging.getLogger("bettercompute.gateway")


class SessionStream:
    """The grpclib handler of ``Session`` (``handle``): admits a daemon, then takes its frames."""

    def __init__(
        self,
        services: GatewayServicesPort,
        options: GatewayOptions,
        *,
        epochs: Epochs,
        sessions: Sessions,
        ingest: Ingest,
        health: Health,
        metrics: Metrics,
    ) -> None:
        self._services = services
        self._name = options.name
        self._hello_timeout = options.hello_timeout
        self._heartbeat_interval = options.heartbeat_interval
        self._most = options.max_message_bytes
        self._epochs = epochs
        self._sessions = sessions
        self._ingest = ingest
        self._health = health
        self._handshakes = metrics.gateway_handshakes

    async def handle(self, stream: Stream[Any, Any]) -> None:
        """One session, from its admission to its end; a refused one is told why (``Close``) and ends with the
        error envelope as its status."""
        try:
            if self._health.draining:
                raise UnavailableError("this gateway is draining; reconnect to another", details={"reason": "draining"})
            node_id, epoch, certificate = await self._admit(stream)
        except ComputeError as exc:
            self._handshakes.labels(exc.code.lower()).inc()
            await self._refuse(stream, exc)
            raise grpc_error(exc) from None
        self._handshakes.labels("ok").inc()
        task = asyncio.current_task()
        session = Session(
            node_id=node_id,
            epoch=epoch,
            serial=format(certificate.serial_number, "x"),
            public_key=certificate.public_key(),
            not_after=certificate.not_valid_after_utc.timestamp(),
            stream=stream,
            task=task,
        )
        sessions = self._sessions
        older = sessions.by_node.get(node_id)
        sessions.by_node[node_id] = session
        if older is not None:
            await sessions.close(older, "superseded", "a newer session of this node opened")
        log.info("node %s: session %d opened on %s", node_id, epoch, self._name)
        try:
            welcome = wire.Welcome(epoch=epoch, heartbeat_interval_ms=ms(self._heartbeat_interval))
            await sessions.send(session, wire.ControlFrame(welcome=welcome))
            await sessions.send(session, wire.ControlFrame(inventory_request=wire.InventoryRequest()))
            sessions.heard.add(node_id)
            await self._serve(session)
        except asyncio.CancelledError:
            if session.closing is None:
                raise  # the server is stopping this handler: not ours to swallow
            if task is not None:
                task.uncancel()  # ``Sessions.close`` woke the read; the stream still ends with a status
        except (StreamTerminatedError, ConnectionError):
            pass
        except Exception as exc:  # nothing of it reaches the daemon or the log but its class
            log.error("node %s: session %d failed: %s", node_id, session.epoch, type(exc).__name__)
            await sessions.close(session, "internal", "the gateway failed; reconnect")
        finally:
            await self._ended(session)
        if session.closing is not None:
            await self._drain(stream)

    async def _ended(self, session: Session) -> None:
        """Take a session that ended out of the table, and record its end unless a newer one replaced it."""
        current = self._sessions.by_node.get(session.node_id) is session
        if current:
            del self._sessions.by_node[session.node_id]
        if current or session.closing == "superseded":
            # Recorded even when the server cancels this handler (the daemon reset the stream): shielded.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._epochs.close(session))
        why = session.closing or "the daemon left"
        log.info("node %s: session %d ended (%s)", session.node_id, session.epoch, why)

    async def _admit(self, stream: Stream[Any, Any]) -> tuple[str, int, x509.Certificate]:
        """Check a new session (see the module docstring) and open it: its node id, epoch and certificate.

        Raises:
            ComputeError: why it is refused.
        """
        certificate_pem = client_certificate(stream)
        certificate = x509.load_pem_x509_certificate(certificate_pem.encode())
        node_id = await self._services.session_node(certificate_pem)
        try:
            async with asyncio.timeout(self._hello_timeout):
                first = await receive(stream, wire.NodeFrame, self._most)
        except TimeoutError:
            raise InvalidInputError("no Hello arrived in time", details={"reason": "protocol"}) from None
        kind, hello = betterproto2.which_one_of(first, "frame") if first is not None else ("", None)
        if not isinstance(hello, wire.Hello):
            raise InvalidInputError("a session opens with Hello", details={"reason": "protocol", "got": kind})
        if hello.node_id != node_id:
            raise UnauthenticatedError(
                "Hello names another node than the connection's certificate", details={"reason": "spiffe_id"}
            )
        return node_id, await self._epochs.open(node_id), certificate

    async def _refuse(self, stream: Stream[Any, Any], error: ComputeError) -> None:
        """Tell a refused daemon why in a ``Close`` frame (its reason is the error's), then let it end its side."""
        reason = str(error.details.get("reason", error.code.lower()))
        close = wire.Close(reason=reason, message=json.dumps(error.to_envelope(), separators=(",", ":")))
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await stream.send_message(wire.ControlFrame(close=close))
        await self._drain(stream)

    async def _drain(self, stream: Stream[Any, Any]) -> None:
        """Read what the daemon still sends until it ends its side (a daemon does on ``Close``), for a little while:
        ending the stream before that would reset it, and a reset can overtake the ``Close`` frame."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                while await receive(stream, wire.NodeFrame, self._most) is not None:
                    pass

    async def _serve(self, session: Session) -> None:
        """Take the session's frames until it ends (this is every heartbeat's path: keep it lean)."""
        silence = 3 * self._heartbeat_interval
        most = self._most
        sessions = self._sessions
        ingest = self._ingest
        close = sessions.close
        while session.closing is None:
            try:
                async with asyncio.timeout(silence):
                    frame = await receive(session.stream, wire.NodeFrame, most)
            except TimeoutError:
                await close(session, "timeout", "no frame for three heartbeat intervals")
                return
            except GRPCError:
                await close(session, "protocol", "a frame was refused")
                return
            if frame is None:
                return
            sessions.heard.add(session.node_id)  # not held in a local: each liveness write swaps the set
            kind, content = betterproto2.which_one_of(frame, "frame")
            if kind == "hello":
                await close(session, "protocol", "Hello was sent twice")
                return
            if isinstance(content, wire.CommandResult):
                await ingest.result(session, content)
            elif isinstance(content, wire.InventorySection):
                await ingest.inventory(session, content)
            elif isinstance(content, wire.NodeEvent):
                await ingest.event(session, content)
            elif isinstance(content, wire.DesiredStateAck):
                ingest.ack(session, content)
