"""Tunnels through the gateway (``docs/tunnels.md``): a client's ``Tunnel`` stream meets a node's.

A client opens ``Tunnel`` without a client certificate; its first frame carries the one-time ticket, which the
control plane spends (``tunnel_accept``). The node must hold its session on this gateway: it is sent ``TunnelOpen``
on that session and has ``node_timeout`` to open its own ``Tunnel`` stream, with its certificate, on the same
connection, whose first frame names the tunnel (``tunnel_node`` checks the certificate is that node's). Then data
frames are carried both ways, one at a time per direction: a side that does not read holds the other back through
HTTP/2 flow control, and nothing is buffered beyond a frame. Each tenant's tunnels share one token bucket of
``bytes_per_second``, and a tenant holds at most ``streams_per_tenant`` tunnels on a gateway at once.

Once a ``check_interval`` one call (``tunnel_check``, one statement for all) asks which open tunnels must close;
those are closed with the reason, as are the tunnels of a node whose session ended here. When the checks cannot be
made for ``check_grace``, every tunnel is closed (``check_unavailable``): a revocation must not outlive an outage.

A tunnel ends with a frame carrying ``close_reason`` to each side still there, then each stream ends; its end is
recorded once (``tunnel_closed``, with the bytes carried), and audited there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.server import Stream

import bettercompute_proto as wire
from bettercompute import Metrics
from bettercompute.errors import (
    ComputeError,
    InvalidInputError,
    QuotaExceededError,
    UnavailableError,
)
from bettercompute.modules.nodes import TunnelGrant

from ._errors import grpc_error, internal
from ._port import GatewayServicesPort
from ._wire import client_certificate

__all__ = ["MAX_DATA_BYTES", "TunnelOptions", "TunnelRelay"]

log = logging.getLogger("bettercompute.gateway.tunnels")

MAX_DATA_BYTES = 64 * 1024
"""The most data one tunnel frame carries."""
_FRAME_OVERHEAD = 512
"""What a data frame's encoding adds to its data at most (field tags, lengths, a close reason)."""


@attrs.frozen(kw_only=True)
class TunnelOptions:
    """The gateway's limits on tunnels.

    Args:
        streams_per_tenant: How many tunnels one tenant may hold open on this gateway at once (more are refused
            with ``QUOTA_EXCEEDED``).
        bytes_per_second: The bandwidth one tenant's tunnels share, each way (a token bucket holding one second of
            it).
        node_timeout: How long the node has to answer ``TunnelOpen`` with its stream.
        check_interval: How often the open tunnels are re-checked with the control plane (one call for all).
        check_grace: How long the checks may fail before every tunnel is closed (``check_unavailable``).
        first_frame_timeout: How long a new stream may take to send its first frame.
    """

    streams_per_tenant: int = 16
    bytes_per_second: int = 8 * 1024 * 1024
    node_timeout: float = 10.0
    check_interval: float = 1.0
    check_grace: float = 10.0
    first_frame_timeout: float = 10.0


class _Bucket:
    """A token bucket of ``rate`` bytes a second holding at most a second's worth; a take beyond what it holds
    waits for it (the debt is paid by waiting, so the average never exceeds the rate)."""

    def __init__(self, rate: int) -> None:
        self._rate = float(rate)
        self._tokens = float(rate)
        self._at = time.monotonic()

    async def take(self, amount: int) -> None:
        now = time.monotonic()
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        self._tokens -= amount
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self._rate)


@attrs.define(eq=False)
class _Tunnel:
    grant: TunnelGrant
    client: Stream[Any, Any]
    node: Stream[Any, Any] | None = None
    node_ready: asyncio.Event = attrs.field(factory=asyncio.Event)
    refused: str | None = None  # the node's reason when it would not connect
    node_done: asyncio.Event = attrs.field(factory=asyncio.Event)
    pump: asyncio.Task[str] | None = None
    closing: str | None = None
    bytes_up: int = 0  # client -> node
    bytes_down: int = 0  # node -> client


Receive = Callable[[Stream[Any, Any], int | None], Awaitable[wire.TunnelFrame | None]]
"""Read one tunnel frame of a stream, refusing one longer than the limit given (``None``: the gateway's)."""
SessionOf = Callable[[str], Any]
"""The live session of a node on this gateway, or ``None``."""
SendControl = Callable[[Any, wire.ControlFrame], Awaitable[None]]
"""Send a control frame on a session (raises when the session cannot take it)."""


class TunnelRelay:
    """The gateway's tunnels: made by the gateway, which hands it the ``Tunnel`` streams."""

    def __init__(
        self,
        services: GatewayServicesPort,
        options: TunnelOptions,
        *,
        receive: Receive,
        session_of: SessionOf,
        send_control: SendControl,
        draining: Callable[[], bool],
        metrics: Metrics,
    ) -> None:
        self._services = services
        self._draining = draining
        tunnels: dict[str, _Tunnel] = {}
        metrics.gateway_tunnels.set_function(lambda: len(tunnels))  # read at scrape time
        self._up = metrics.gateway_tunnel_bytes.labels("up")
        self._down = metrics.gateway_tunnel_bytes.labels("down")
        self.options = options
        self._receive = receive
        self._session_of = session_of
        self._send_control = send_control
        self._tunnels: dict[str, _Tunnel] = tunnels
        self._buckets: dict[str, tuple[_Bucket, _Bucket]] = {}
        self._failing_since: float | None = None

    @property
    def open(self) -> dict[str, str]:
        """The tunnels open now: id -> node id."""
        return {i: t.grant.node_id for i, t in self._tunnels.items()}

    def _held(self, tenant: str) -> int:
        return sum(1 for t in self._tunnels.values() if t.grant.tenant == tenant)

    async def handle(self, stream: Stream[Any, Any]) -> None:
        """The grpclib handler of ``Tunnel``: a client's or a node's stream. A refusal sends a frame with its reason
        as ``close_reason``, then ends the stream with the error envelope once the caller ended its side."""
        try:
            if self._draining():
                raise UnavailableError("this gateway is draining; connect to another", details={"reason": "draining"})
            await self.serve(stream, client_certificate(stream, required=False))
        except GRPCError:
            raise
        except ComputeError as exc:
            # The reason in a closing frame first, then the status once the caller ended its side: ending the
            # stream before that would reset it, and a reset can overtake the status.
            reason = str(exc.details.get("reason", exc.code.lower()))
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await stream.send_message(wire.TunnelFrame(close_reason=reason))
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    while await self._receive(stream, None) is not None:
                        pass
            raise grpc_error(exc) from None
        except (StreamTerminatedError, ConnectionError):
            pass
        except Exception as exc:  # nothing of it reaches the caller or the log but its class
            log.error("a tunnel stream failed: %s", type(exc).__name__)
            raise internal() from None

    async def serve(self, stream: Stream[Any, Any], certificate_pem: str | None) -> None:
        """A ``Tunnel`` stream: a client's (first frame: ``ticket``) or a node's (first frame: ``tunnel_id``, with
        the node's certificate).

        Raises:
            ComputeError: why the stream is refused (the gateway makes it the envelope of the status).
        """
        try:
            async with asyncio.timeout(self.options.first_frame_timeout):
                first = await self._receive(stream, None)
        except TimeoutError:
            raise InvalidInputError("no first frame arrived in time", details={"reason": "protocol"}) from None
        if first is None:
            raise InvalidInputError("a tunnel stream opens with a frame", details={"reason": "protocol"})
        if first.ticket and not first.tunnel_id:
            await self._client(stream, first.ticket)
        elif first.tunnel_id and not first.ticket and certificate_pem is not None:
            await self._node(stream, first, certificate_pem)
        else:
            raise InvalidInputError(
                "a tunnel stream opens with a ticket (a client) or a tunnel id (a node, with its certificate)",
                details={"reason": "protocol"},
            )

    # --- the client's side ----------------------------------------------------------------------------------------

    async def _client(self, stream: Stream[Any, Any], ticket: str) -> None:
        grant = await self._services.tunnel_accept(ticket)
        if self._held(grant.tenant) >= self.options.streams_per_tenant:
            await self._record(grant.id, "limit", 0, 0)
            raise QuotaExceededError(
                f"the tenant holds {self.options.streams_per_tenant} tunnels on this gateway already",
                details={"reason": "tunnels_per_tenant", "limit": self.options.streams_per_tenant},
            )
        session = self._session_of(grant.node_id)
        if session is None:
            await self._record(grant.id, "node_not_connected", 0, 0)
            raise UnavailableError(
                "the node holds no session on this gateway (routing a tunnel to another gateway is not done yet)",
                details={"reason": "node_not_connected", "node_id": grant.node_id},
            )
        tunnel = _Tunnel(grant=grant, client=stream)
        self._tunnels[grant.id] = tunnel
        reason = "internal"
        try:
            reason = await self._connect(tunnel, session)
            if reason == "" and tunnel.closing is None:
                pump = tunnel.pump = asyncio.create_task(self._pump(tunnel), name=f"tunnel-{grant.id}")
                try:
                    await asyncio.wait({pump})  # ``end`` cancels the pump, not this task
                except asyncio.CancelledError:
                    tunnel.closing = tunnel.closing or "gateway_closing"
                    pump.cancel()
                    raise
                if pump.cancelled():
                    reason = tunnel.closing or "closed"
                elif pump.exception() is not None:
                    log.error("tunnel %s failed: %s", grant.id, type(pump.exception()).__name__)
                    reason = "internal"
                else:
                    reason = pump.result()
        except asyncio.CancelledError:
            reason = tunnel.closing or "client_left"
            raise
        finally:
            reason = tunnel.closing or reason
            tunnel.closing = reason
            del self._tunnels[grant.id]
            await asyncio.shield(self._finish(tunnel, reason))

    async def _connect(self, tunnel: _Tunnel, session: Any) -> str:
        """Ask the node to connect and wait for its stream: ``""`` once it is there, else why not."""
        grant = tunnel.grant
        frame = wire.ControlFrame(tunnel_open=wire.TunnelOpen(tunnel_id=grant.id, host=grant.host, port=grant.port))
        try:
            await self._send_control(session, frame)
        except Exception:
            return "node_not_connected"
        try:
            async with asyncio.timeout(self.options.node_timeout):
                await tunnel.node_ready.wait()
        except TimeoutError:
            return "node_timeout"
        if tunnel.closing is not None:
            return tunnel.closing
        return tunnel.refused or ""

    def _buckets_of(self, tenant: str) -> tuple[_Bucket, _Bucket]:
        buckets = self._buckets.get(tenant)
        if buckets is None:
            rate = self.options.bytes_per_second
            buckets = self._buckets[tenant] = (_Bucket(rate), _Bucket(rate))
        return buckets

    async def _pump(self, tunnel: _Tunnel) -> str:
        """Carry frames both ways until one side ends; why it ended."""
        assert tunnel.node is not None
        up_bucket, down_bucket = self._buckets_of(tunnel.grant.tenant)
        up = asyncio.create_task(self._carry(tunnel, tunnel.client, tunnel.node, up_bucket, up=True))
        down = asyncio.create_task(self._carry(tunnel, tunnel.node, tunnel.client, down_bucket, up=False))
        try:
            done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            return done.pop().result()
        finally:
            for task in (up, down):
                task.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _carry(
        self, tunnel: _Tunnel, source: Stream[Any, Any], sink: Stream[Any, Any], bucket: _Bucket, *, up: bool
    ) -> str:
        side = "client" if up else "node"
        while True:
            try:
                frame = await self._receive(source, MAX_DATA_BYTES + _FRAME_OVERHEAD)
            except GRPCError:
                return "protocol"
            except (StreamTerminatedError, ConnectionError):
                return f"{side}_left"
            if frame is None:
                return f"{side}_left"
            if frame.close_reason:
                return frame.close_reason[:64] if not up else "client_closed"
            data = frame.data
            if len(data) > MAX_DATA_BYTES or frame.ticket or frame.tunnel_id:
                return "protocol"
            if not data:
                continue
            await bucket.take(len(data))
            try:
                await sink.send_message(wire.TunnelFrame(data=data))
            except (StreamTerminatedError, ConnectionError):
                return f"{'node' if up else 'client'}_left"
            if up:
                tunnel.bytes_up += len(data)
                self._up.inc(len(data))
            else:
                tunnel.bytes_down += len(data)
                self._down.inc(len(data))

    async def _finish(self, tunnel: _Tunnel, reason: str) -> None:
        """Tell both sides why the tunnel ends, let the node's stream end, and record the end."""
        for stream in (tunnel.client, tunnel.node):
            if stream is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        await stream.send_message(wire.TunnelFrame(close_reason=reason))
        tunnel.node_ready.set()
        tunnel.node_done.set()
        await self._record(tunnel.grant.id, reason, tunnel.bytes_up, tunnel.bytes_down)
        log.info(
            "tunnel %s to node %s closed (%s): %d bytes up, %d down",
            tunnel.grant.id,
            tunnel.grant.node_id,
            reason,
            tunnel.bytes_up,
            tunnel.bytes_down,
        )
        await self._drain(tunnel.client)

    async def _record(self, tunnel_id: str, reason: str, up: int, down: int) -> None:
        try:
            await self._services.tunnel_closed(tunnel_id, reason, up, down)
        except Exception as exc:  # the database away: the row stays open until the control plane's sweep
            log.warning("tunnel %s: its end was not recorded: %s", tunnel_id, type(exc).__name__)

    async def _drain(self, stream: Stream[Any, Any]) -> None:
        """Read what a side still sends for a little while, so that ending the stream does not reset it before the
        close frame arrives."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                while await self._receive(stream, MAX_DATA_BYTES + _FRAME_OVERHEAD) is not None:
                    pass

    # --- the node's side ------------------------------------------------------------------------------------------

    async def _node(self, stream: Stream[Any, Any], first: wire.TunnelFrame, certificate_pem: str) -> None:
        grant = await self._services.tunnel_node(first.tunnel_id, certificate_pem)
        tunnel = self._tunnels.get(grant.id)
        if tunnel is None or tunnel.node is not None or tunnel.node_ready.is_set():
            raise InvalidInputError(
                "the tunnel is not waiting for its node on this gateway", details={"reason": "not_waiting"}
            )
        if first.close_reason:
            tunnel.refused = first.close_reason[:64]
            tunnel.node_ready.set()
            return
        tunnel.node = stream
        tunnel.node_ready.set()
        await tunnel.node_done.wait()
        await self._drain(stream)

    # --- checks ---------------------------------------------------------------------------------------------------

    def end(self, tunnel_id: str, reason: str) -> None:
        """Close a tunnel with ``reason`` (its client's task does the rest)."""
        tunnel = self._tunnels.get(tunnel_id)
        if tunnel is None or tunnel.closing is not None:
            return
        tunnel.closing = reason
        tunnel.node_ready.set()
        if tunnel.pump is not None:
            tunnel.pump.cancel()

    async def check(self) -> None:
        """One pass: close the tunnels the control plane says must close, and those whose node's session is gone
        from this gateway; when the checks have failed for ``check_grace``, close them all."""
        live = [t for t in self._tunnels.values() if t.closing is None]
        for tunnel in live:
            if self._session_of(tunnel.grant.node_id) is None:
                self.end(tunnel.grant.id, "node_disconnected")
        ids = [t.grant.id for t in live if t.closing is None]
        if not ids:
            self._failing_since = None
            return
        try:
            reasons = await self._services.tunnel_check(ids)
        except Exception as exc:
            now = time.monotonic()
            self._failing_since = self._failing_since or now
            log.warning("tunnels not checked: %s", type(exc).__name__)
            if now - self._failing_since >= self.options.check_grace:
                for tunnel_id in ids:
                    self.end(tunnel_id, "check_unavailable")
            return
        self._failing_since = None
        for tunnel_id, reason in reasons.items():
            log.info("tunnel %s must close: %s", tunnel_id, reason)
            self.end(tunnel_id, reason)

    async def run(self) -> None:
        """Check the open tunnels every ``check_interval`` until cancelled."""
        while True:
            await asyncio.sleep(self.options.check_interval)
            with contextlib.suppress(Exception):
                await self.check()

    def close_all(self, reason: str) -> None:
        """Close every tunnel (the gateway is closing)."""
        for tunnel_id in list(self._tunnels):
            self.end(tunnel_id, reason)
