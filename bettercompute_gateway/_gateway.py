"""The gateway: daemons' ``Join``, ``Renew`` and ``Secret`` relayed to the control plane's services, and their
``Session`` streams held in memory.

Every method is a raw grpclib handler (not the generated base class) for three reasons: a message is refused by its
length prefix before it is read (grpclib reads any length it is sent), the connection's client certificate is read
from the TLS connection, and every failure becomes one error envelope.

A session, in order: a client certificate is required (the handshake verified its chain against the trust bundle);
the first frame must be ``Hello`` within ``hello_timeout``; the certificate must be current for a live node (the
control plane's ``node_of``: not expired, chaining to the bundle, issued here, not revoked, role ``node``, node not
retired) and its node id must be the one in ``Hello``. Then the node's next epoch is taken (``Sessions.open``), an
older session of the node on this gateway is closed (``superseded``), ``Welcome`` carries the epoch and the
heartbeat interval, and inventory is asked for. Frames then flow until the daemon ends the stream, stays silent for
three heartbeat intervals (``timeout``), or the gateway closes it. Liveness is written by one loop, one statement
per flush for every session heard from since the last (``Sessions.seen``), whatever their number; the same loop
closes (``revoked``) the sessions whose certificate was revoked since (a node revoked or retired), one statement
for all of them.

Closing a session sends ``Close`` with its reason, then waits a little for the daemon to end its side before the
stream ends with a status (a refused session's status carries the error envelope): ending first would reset the
stream, and a reset can overtake the ``Close`` frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import gc
import json
import logging
import math
import re
import ssl
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, overload

import attrs
import betterproto2
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpclib.config import Configuration
from grpclib.const import Cardinality, Handler, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.protocol import H2Protocol
from grpclib.server import Handler as ConnectionHandler
from grpclib.server import Server, Stream
from h2.settings import SettingCodes

import bettercompute_proto as wire
from bettercompute import Metrics
from bettercompute._runtime.codec import storable_json
from bettercompute.errors import ComputeError, InvalidInputError, UnauthenticatedError, UnavailableError
from bettercompute.modules.commands import COMMANDS, SESSION_CLOSED, SESSION_OPENED, SESSIONS
from bettercompute.modules.nodes import (
    CERTIFICATES,
    DESIRED_STATE_CHANNEL,
    INVENTORY_REPORTED,
    INVENTORY_SECTIONS,
    NODE_REPORTED,
    NODES,
    DesiredState,
    GatewayServices,
    JoinResult,
    RenewResult,
    acked_item,
    inventory_item,
    lifecycle_item,
    verify_signature,
)
from bettercompute.ports import Notifier, OutboxEvent, Store
from bettercompute_proto import health

from ._errors import grpc_error, internal
from ._tls import GatewayTls, load, server_context
from ._tunnels import TunnelOptions, TunnelRelay

__all__ = ["Gateway", "GatewayOptions", "create_gateway"]

log = logging.getLogger("bettercompute.gateway")

M = TypeVar("M", bound=betterproto2.Message)

_SERVED = frozenset({"", wire.SERVICE})
"""The services the health service answers for ("": the gateway as a whole)."""
_EVENTS_PER_MINUTE = 60
_EVENT_TYPE = re.compile(r"[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)*")
_MAX_QUEUED = 32
"""How many frames from the flush loop may wait for one slow daemon before its session is closed as ``slow``."""
ACK_GATHER_SECONDS = 0.02
"""How long the acknowledgement writer gathers acks after the first before writing them (``_ack_loop``)."""
_DESIRED_LOOKBACK = 30.0
"""How far back (seconds) each poll of changed desired states reaches: a change whose transaction committed up to
this long after it was dated is still seen; the full comparison every ``desired_sweep_interval`` catches the rest."""


@attrs.frozen(kw_only=True)
class GatewayOptions:
    """How a gateway runs. grpclib's own defaults are unsafe for thousands of daemons (no message size limit, 4 MiB
    windows per connection and stream, a listen backlog of 100, keepalive after two hours), so each is set here.

    Args:
        name: This gateway's name (sessions record which gateway holds them).
        heartbeat_interval: How often daemons beat (sent in ``Welcome``); three intervals of silence end a session.
        liveness_flush_interval: How often liveness is written (one statement for all sessions heard from).
        hello_timeout: How long a new session may take to send ``Hello``.
        send_timeout: How long a frame may wait for a slow daemon to read before its session is closed (``slow``).
        max_message_bytes: The largest message taken (its length prefix is checked before it is read).
        connection_window_bytes: HTTP/2 flow-control window per connection.
        stream_window_bytes: HTTP/2 flow-control window per stream.
        backlog: The listen backlog (a reconnect storm arrives at once).
        keepalive: How often the gateway pings an idle connection (and drops one that does not answer).
        max_streams_per_connection: How many calls one connection may have open at once (HTTP/2's
            ``MAX_CONCURRENT_STREAMS``; h2's default is 100); more are refused by HTTP/2 itself.
        drain_period: Over how long ``drain`` spreads the closing of its sessions, so that the daemons reconnect
            elsewhere a few at a time rather than all at once.
        desired_sweep_interval: How often every session's desired-state generation is compared with the nodes' (a
            backstop; changes are otherwise read each flush, and at once on a notifier poke).
        gc_young_threshold: When the gateway starts, the process's first garbage-collector threshold is raised to
            at least this (a setting of the whole process; ``None`` leaves it). With Python's 700, the flush loop's
            lists of every session set off young collections that moved them to the old generation, whose full
            collections (over about 170 objects a session, every 30 s or so) took 11 of the gateway's 42 % of a core
            at 15,000 sessions (``bench/gateway.py``).
        tunnels: The limits on tunnels (``TunnelOptions``: streams and bandwidth per tenant, the node's time to
            answer, how often open tunnels are re-checked).
    """

    name: str = "gateway"
    heartbeat_interval: float = 10.0
    liveness_flush_interval: float = 1.0
    hello_timeout: float = 10.0
    send_timeout: float = 10.0
    max_message_bytes: int = 1024 * 1024
    connection_window_bytes: int = 1024 * 1024
    stream_window_bytes: int = 256 * 1024
    backlog: int = 4096
    keepalive: float = 60.0
    max_streams_per_connection: int = 8
    drain_period: float = 30.0
    desired_sweep_interval: float = 60.0
    gc_young_threshold: int | None = 50_000
    tunnels: TunnelOptions = attrs.field(factory=TunnelOptions)


@attrs.define(eq=False)
class _Session:
    node_id: str
    epoch: int
    serial: str
    public_key: Any
    stream: Stream[Any, Any]
    heard: float
    task: asyncio.Task[Any] | None
    closing: str | None = None
    sends: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    commands: dict[str, str] = attrs.field(factory=dict)  # dispatched on this session: id -> kind
    sent_generation: int | None = None  # the desired-state generation sent; None until first looked up
    queued: int = 0  # frames from the flush loop waiting to be sent
    not_after: float = float("inf")  # when the session's certificate expires (seconds since the epoch)
    events: int = 0  # events taken in the current minute
    events_since: float = 0.0


class Gateway:
    """A gateway: ``await gateway.start(host, port)``, then ``await gateway.close()``. Made by ``create_gateway``."""

    def __init__(
        self,
        services: GatewayServices,
        store: Store,
        tls: GatewayTls,
        options: GatewayOptions,
        notifier: Notifier | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._services = services
        # Without the control plane's, a registry of the gateway's own that nothing serves: recording stays uniform.
        self._metrics = metrics or Metrics()
        self._store = store
        self._tls = tls
        self.options = options
        self._notifier = notifier
        self._sessions: dict[str, _Session] = {}
        self._heard: set[str] = set()  # node ids heard from since the last flush
        self._acks: dict[str, int] = {}  # desired-state generations acknowledged since the last flush
        self._ack_wake = asyncio.Event()  # set when an acknowledgement arrives
        self._server: _Server | None = None
        self._context: ssl.SSLContext | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._deliveries: set[asyncio.Future[None]] = set()
        self._draining = False
        self._database_ok = True  # until a pass of the flush loop fails
        self._health_changed = asyncio.Event()  # set, and replaced, when the served status changes
        self._desired_lock = asyncio.Lock()
        self._desired_since: dt.datetime | None = None
        self._desired_sweep_at = 0.0
        self.port: int | None = None
        self._relay = TunnelRelay(
            services,
            options.tunnels,
            receive=lambda stream, limit: self._receive(stream, wire.TunnelFrame, limit=limit),
            session_of=self._live_session,
            send_control=self._send,
            metrics=self._metrics,
        )

    def _live_session(self, node_id: str) -> _Session | None:
        session = self._sessions.get(node_id)
        return session if session is not None and session.closing is None else None

    @property
    def tunnels(self) -> Mapping[str, str]:
        """The tunnels open through this gateway now: tunnel id -> node id."""
        return self._relay.open

    def __repr__(self) -> str:
        return f"Gateway(name={self.options.name!r}, port={self.port!r}, sessions={len(self._sessions)})"

    @property
    def sessions(self) -> Mapping[str, int]:
        """The sessions held now: node id -> epoch."""
        return {node_id: s.epoch for node_id, s in self._sessions.items()}

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (``0``: any free port) and start the liveness loop; returns the port."""
        young, middle, old = gc.get_threshold()
        if self.options.gc_young_threshold is not None and young < self.options.gc_young_threshold:
            gc.set_threshold(self.options.gc_young_threshold, middle, old)
        config = Configuration(
            http2_connection_window_size=self.options.connection_window_bytes,
            http2_stream_window_size=self.options.stream_window_bytes,
            _keepalive_time=self.options.keepalive,
            _keepalive_timeout=min(20.0, self.options.keepalive),
        )
        server = _Server([self], config=config, max_streams=self.options.max_streams_per_connection)
        self._context = server_context(self._tls)
        await server.start(host, port, ssl=self._context, backlog=self.options.backlog)
        self._server = server
        sessions = self._sessions
        self._metrics.gateway_sessions.set_function(lambda: len(sessions))  # read at scrape time
        # grpclib does not say which port it bound. Its listening server is asyncio's, or uvloop's (which is no
        # ``asyncio.Server``): either has ``sockets``.
        sockets = getattr(server._server, "sockets", None) or ()
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        self._tasks = [
            asyncio.create_task(self._flush_loop(), name="gateway-liveness"),
            asyncio.create_task(self._ack_loop(), name="gateway-acks"),
            asyncio.create_task(self._relay.run(), name="gateway-tunnel-checks"),
        ]
        if self._notifier is not None:
            self._tasks.append(asyncio.create_task(self._listen_desired(), name="gateway-desired-pokes"))
        log.info("gateway %s listening on %s:%s", self.options.name, host, self.port)
        return self.port

    def reload_tls(self, tls: GatewayTls) -> None:
        """Use a new server certificate (and trust bundle) for the connections made from now on.

        Raises:
            ssl.SSLError: it does not load (the old one stays in use).
        """
        server_context(tls)  # fails here, before the live context is touched, if it does not load
        if self._context is not None:
            load(self._context, tls)
        self._tls = tls

    @property
    def serving(self) -> bool:
        """What the health service says: serving unless draining or the database could not be reached by the last
        pass of the flush loop."""
        return not self._draining and self._database_ok

    @property
    def draining(self) -> bool:
        """Whether ``drain`` was called: no new session is taken."""
        return self._draining

    def _health_may_have_changed(self, before: bool) -> None:
        if self.serving != before:
            changed, self._health_changed = self._health_changed, asyncio.Event()
            changed.set()
            log.warning("gateway %s is %s", self.options.name, "serving" if self.serving else "not serving")

    async def drain(self, *, period: float | None = None) -> None:
        """Stop taking sessions (health answers NOT_SERVING, so load balancers send daemons elsewhere), then close
        the sessions held with reason ``draining``, spread evenly over ``period`` (``options.drain_period``): the
        daemons reconnect, through the load balancer, to the other gateways a few at a time. Calls other than
        ``Session`` are still answered. Returns when the last session is closed."""
        before = self.serving
        self._draining = True
        self._health_may_have_changed(before)
        sessions = [s for s in self._sessions.values() if s.closing is None]
        period = self.options.drain_period if period is None else period
        pause = period / len(sessions) if sessions else 0.0
        log.info("gateway %s draining %d sessions over %.0f s", self.options.name, len(sessions), period)
        for index, session in enumerate(sessions):
            if index and pause:
                await asyncio.sleep(pause)
            await self._close(session, "draining", "this gateway is draining; reconnect to another")

    async def close(self, *, reason: str = "draining") -> None:
        """Close every tunnel and session with ``reason`` at once, stop listening, and write the last liveness.
        Idempotent."""
        self._relay.close_all(reason)
        for session in list(self._sessions.values()):
            await self._close(session, reason, "the gateway is closing")
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
            server.drop_connections()
        tasks, self._tasks = self._tasks, []
        for task in [*tasks, *self._deliveries]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if tasks:
            with contextlib.suppress(Exception):
                await self._flush()

    # --- grpclib ------------------------------------------------------------------------------------------------

    def __mapping__(self) -> dict[str, Handler]:
        def unary(handler: Callable[[Stream[Any, Any]], Awaitable[None]], request: type, reply: type) -> Handler:
            return Handler(handler, Cardinality.UNARY_UNARY, request, reply)

        path = f"/{wire.SERVICE}/"
        return {
            path + "Join": unary(self._join, wire.JoinRequest, wire.JoinResponse),
            path + "TrustBundle": unary(self._trust_bundle, wire.TrustBundleRequest, wire.TrustBundleResponse),
            path + "RenewChallenge": unary(
                self._renew_challenge, wire.RenewChallengeRequest, wire.RenewChallengeResponse
            ),
            path + "Renew": unary(self._renew, wire.RenewRequest, wire.RenewResponse),
            path + "Secret": unary(self._secret, wire.SecretRequest, wire.SecretResponse),
            path + "Session": Handler(self._session, Cardinality.STREAM_STREAM, wire.NodeFrame, wire.ControlFrame),
            path + "Tunnel": Handler(self._tunnel, Cardinality.STREAM_STREAM, wire.TunnelFrame, wire.TunnelFrame),
            path + "Call": unary(self._call, wire.CallRequest, wire.CallResponse),
            f"/{health.SERVICE}/Check": unary(
                self._health_check, health.HealthCheckRequest, health.HealthCheckResponse
            ),
            f"/{health.SERVICE}/Watch": Handler(
                self._health_watch, Cardinality.UNARY_STREAM, health.HealthCheckRequest, health.HealthCheckResponse
            ),
        }

    async def _receive(self, stream: Stream[Any, Any], kind: type[M], *, limit: int | None = None) -> M | None:
        """The next message of ``stream`` (``None`` at its end), refused by its length before it is read.

        Raises:
            GRPCError: ``RESOURCE_EXHAUSTED`` for a message over ``limit`` (``max_message_bytes`` by default),
                ``INVALID_ARGUMENT`` for one that does not parse or is compressed.
        """
        most = self.options.max_message_bytes if limit is None else min(limit, self.options.max_message_bytes)
        raw = stream._stream
        head = await raw.recv_data(5)
        if not head:
            return None
        if len(head) != 5:
            raise grpc_error(InvalidInputError("a message was cut short", details={"reason": "malformed"}))
        compressed, length = struct.unpack(">?I", head)
        if compressed:
            raise grpc_error(InvalidInputError("compressed messages are not taken", details={"reason": "malformed"}))
        if length > most:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                json.dumps(
                    {
                        "error": {
                            "code": "INVALID_INPUT",
                            "message": f"a message is at most {most} bytes",
                            "details": {"reason": "too_large", "max_bytes": most},
                            "retryable": False,
                        }
                    }
                ),
            )
        body = await raw.recv_data(length)
        if len(body) != length:
            raise grpc_error(InvalidInputError("a message was cut short", details={"reason": "malformed"}))
        try:
            return kind.parse(body)
        except Exception:
            raise grpc_error(InvalidInputError("a message does not parse", details={"reason": "malformed"})) from None

    async def _unary(self, stream: Stream[Any, Any], kind: type[M], answer: Callable[[M], Awaitable[Any]]) -> None:
        try:
            request = await self._receive(stream, kind)
            if request is None:
                raise grpc_error(InvalidInputError("no request was sent", details={"reason": "malformed"}))
            reply = await answer(request)
        except GRPCError:
            raise
        except ComputeError as exc:
            raise grpc_error(exc) from None
        except Exception as exc:
            log.error("%s failed: %s", kind.__name__, type(exc).__name__)
            raise internal() from None
        await stream.send_message(reply)

    # --- relayed calls ------------------------------------------------------------------------------------------

    async def _join(self, stream: Stream[Any, Any]) -> None:
        async def answer(request: wire.JoinRequest) -> wire.JoinResponse:
            result = await self._services.join(
                sealed_token=request.sealed_token,
                csr_pem=request.csr_pem,
                claims=_json_object(request.claims_json, "claims_json"),
                evidence=_json_object(request.evidence_json, "evidence_json") if request.evidence_json else None,
                pool_id=request.pool_id or None,
            )
            return wire.JoinResponse(
                certificate=_certificate(result),
                tenant=result.tenant,
                pool_id=result.pool_id,
                reclaimed=result.reclaimed,
            )

        await self._unary(stream, wire.JoinRequest, answer)

    async def _trust_bundle(self, stream: Stream[Any, Any]) -> None:
        # No client certificate needed: a daemon pinned with ``--ca-pin`` asks before it trusts anything, and checks
        # the answer against its pin (the bundle is public; the pin is what makes it trusted).
        async def answer(request: wire.TrustBundleRequest) -> wire.TrustBundleResponse:
            return wire.TrustBundleResponse(trust_bundle_pem=await self._services.trust_bundle_pem())

        await self._unary(stream, wire.TrustBundleRequest, answer)

    async def _renew_challenge(self, stream: Stream[Any, Any]) -> None:
        async def answer(request: wire.RenewChallengeRequest) -> wire.RenewChallengeResponse:
            challenge = await self._services.renew_challenge(certificate_pem=_client_certificate(stream))
            return wire.RenewChallengeResponse(challenge=challenge)

        await self._unary(stream, wire.RenewChallengeRequest, answer)

    async def _renew(self, stream: Stream[Any, Any]) -> None:
        async def answer(request: wire.RenewRequest) -> wire.RenewResponse:
            result = await self._services.renew(
                certificate_pem=_client_certificate(stream),
                challenge=request.challenge,
                signature=request.signature,
                csr_pem=request.csr_pem,
            )
            return wire.RenewResponse(certificate=_certificate(result))

        await self._unary(stream, wire.RenewRequest, answer)

    async def _secret(self, stream: Stream[Any, Any]) -> None:
        async def answer(request: wire.SecretRequest) -> wire.SecretResponse:
            jwe = await self._services.secret(
                certificate_pem=_client_certificate(stream),
                name=request.name,
                ephemeral_public_jwk=_json_object(request.ephemeral_public_jwk_json, "ephemeral_public_jwk_json"),
                signed_at_ms=request.signed_at_ms,
                nonce=request.nonce,
                signature=request.signature,
            )
            return wire.SecretResponse(jwe=jwe)

        await self._unary(stream, wire.SecretRequest, answer)

    async def _call(self, stream: Stream[Any, Any]) -> None:
        # A module's gateway method: the control plane checks the certificate (when there is one) and its role.
        async def answer(request: wire.CallRequest) -> wire.CallResponse:
            output = await self._services.call(
                request.method,
                certificate_pem=_client_certificate(stream, required=False),
                input=_json_object(request.input_json, "input_json"),
            )
            return wire.CallResponse(output_json=json.dumps(output, separators=(",", ":")))

        await self._unary(stream, wire.CallRequest, answer)

    # --- health ---------------------------------------------------------------------------------------------------

    def _status(self) -> health.ServingStatus:
        return health.ServingStatus.SERVING if self.serving else health.ServingStatus.NOT_SERVING

    async def _health_check(self, stream: Stream[Any, Any]) -> None:
        """``Check``: the status now (no client certificate needed; nothing is read from the database)."""
        request = await self._receive(stream, health.HealthCheckRequest)
        if request is None or request.service not in _SERVED:
            raise GRPCError(Status.NOT_FOUND, "unknown service")
        await stream.send_message(health.HealthCheckResponse(status=self._status()))

    async def _health_watch(self, stream: Stream[Any, Any]) -> None:
        """``Watch``: the status now, then each change, until the caller leaves or the gateway closes; an unknown
        service gets ``SERVICE_UNKNOWN`` and the call stays open, as the protocol asks."""
        request = await self._receive(stream, health.HealthCheckRequest)
        if request is None or request.service not in _SERVED:
            await stream.send_message(health.HealthCheckResponse(status=health.ServingStatus.SERVICE_UNKNOWN))
            await asyncio.Event().wait()
        sent = None
        while True:
            changed = self._health_changed
            status = self._status()
            if status != sent:
                await stream.send_message(health.HealthCheckResponse(status=status))
                sent = status
            await changed.wait()

    async def _tunnel(self, stream: Stream[Any, Any]) -> None:
        """A client's or a node's ``Tunnel`` stream (``_tunnels``). A refusal sends a frame with its reason as
        ``close_reason``, then ends the stream with the error envelope once the caller ended its side."""
        try:
            if self._draining:
                raise UnavailableError("this gateway is draining; connect to another", details={"reason": "draining"})
            await self._relay.serve(stream, _client_certificate(stream, required=False))
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
                    while await self._receive(stream, wire.TunnelFrame) is not None:
                        pass
            raise grpc_error(exc) from None
        except (StreamTerminatedError, ConnectionError):
            pass
        except Exception as exc:  # nothing of it reaches the caller or the log but its class
            log.error("a tunnel stream failed: %s", type(exc).__name__)
            raise internal() from None

    # --- sessions -----------------------------------------------------------------------------------------------

    async def _session(self, stream: Stream[Any, Any]) -> None:
        try:
            if self._draining:
                raise UnavailableError("this gateway is draining; reconnect to another", details={"reason": "draining"})
            node_id, epoch, certificate = await self._admit(stream)
        except ComputeError as exc:
            self._metrics.gateway_handshakes.labels(exc.code.lower()).inc()
            await self._refuse(stream, exc)
            raise grpc_error(exc) from None
        self._metrics.gateway_handshakes.labels("ok").inc()
        task = asyncio.current_task()
        session = _Session(
            node_id=node_id,
            epoch=epoch,
            serial=format(certificate.serial_number, "x"),
            public_key=certificate.public_key(),
            not_after=certificate.not_valid_after_utc.timestamp(),
            stream=stream,
            heard=time.monotonic(),
            task=task,
        )
        older = self._sessions.get(node_id)
        self._sessions[node_id] = session
        if older is not None:
            await self._close(older, "superseded", "a newer session of this node opened")
        log.info("node %s: session %d opened on %s", node_id, epoch, self.options.name)
        try:
            welcome = wire.Welcome(epoch=epoch, heartbeat_interval_ms=_ms(self.options.heartbeat_interval))
            await self._send(session, wire.ControlFrame(welcome=welcome))
            await self._send(session, wire.ControlFrame(inventory_request=wire.InventoryRequest()))
            self._heard.add(node_id)
            await self._serve(session)
        except asyncio.CancelledError:
            if session.closing is None:
                raise  # the server is stopping this handler: not ours to swallow
            if task is not None:
                task.uncancel()  # ``_close`` woke the read; the stream still ends with a status
        except (StreamTerminatedError, ConnectionError):
            pass
        except Exception as exc:  # nothing of it reaches the daemon or the log but its class
            log.error("node %s: session %d failed: %s", node_id, session.epoch, type(exc).__name__)
            await self._close(session, "internal", "the gateway failed; reconnect")
        finally:
            current = self._sessions.get(node_id) is session
            if current:
                del self._sessions[node_id]
            if current or session.closing == "superseded":
                # Recorded even when the server cancels this handler (the daemon reset the stream): shielded.
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._closed(session))
            log.info("node %s: session %d ended (%s)", node_id, session.epoch, session.closing or "the daemon left")
        if session.closing is not None:
            await self._drain(stream)

    async def _admit(self, stream: Stream[Any, Any]) -> tuple[str, int, x509.Certificate]:
        """Check a new session (see the module docstring) and open it: its node id, epoch and certificate.

        Raises:
            ComputeError: why it is refused.
        """
        certificate_pem = _client_certificate(stream)
        certificate = x509.load_pem_x509_certificate(certificate_pem.encode())
        node = await self._services.joins.node_of(certificate_pem)
        try:
            async with asyncio.timeout(self.options.hello_timeout):
                first = await self._receive(stream, wire.NodeFrame)
        except TimeoutError:
            raise InvalidInputError("no Hello arrived in time", details={"reason": "protocol"}) from None
        kind, hello = betterproto2.which_one_of(first, "frame") if first is not None else ("", None)
        if not isinstance(hello, wire.Hello):
            raise InvalidInputError("a session opens with Hello", details={"reason": "protocol", "got": kind})
        if hello.node_id != node.id:
            raise UnauthenticatedError(
                "Hello names another node than the connection's certificate", details={"reason": "spiffe_id"}
            )
        async with self._store.transaction() as tx:
            record = await tx.repository(SESSIONS).open(node_id=node.id, gateway=self.options.name)
            payload = {"node_id": node.id, "epoch": record.epoch, "gateway": self.options.name}
            await tx.publish([OutboxEvent(type=SESSION_OPENED, key=node.id, payload=payload)])
            await tx.enqueue([lifecycle_item(node.id)])  # reachable again: the lifecycle controller takes note
        return node.id, record.epoch, certificate

    async def _closed(self, session: _Session) -> None:
        """Record that a session ended, and publish ``node.session_closed`` with why (``left``: the daemon ended it;
        ``superseded`` when a newer session replaced it); nothing twice for a session closed already."""
        async with self._store.transaction() as tx:
            current = await tx.repository(SESSIONS).close(node_id=session.node_id, epoch=session.epoch)
            if current or session.closing == "superseded":
                payload = {
                    "node_id": session.node_id,
                    "epoch": session.epoch,
                    "gateway": self.options.name,
                    "reason": session.closing or "left",
                }
                await tx.publish([OutboxEvent(type=SESSION_CLOSED, key=session.node_id, payload=payload)])
            if current:
                await tx.enqueue([lifecycle_item(session.node_id)])  # ``Reachable`` turns false; the timeout runs

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
                while await self._receive(stream, wire.NodeFrame) is not None:
                    pass

    async def _serve(self, session: _Session) -> None:
        """Take the session's frames until it ends."""
        silence = 3 * self.options.heartbeat_interval
        while session.closing is None:
            try:
                async with asyncio.timeout(silence):
                    frame = await self._receive(session.stream, wire.NodeFrame)
            except TimeoutError:
                await self._close(session, "timeout", "no frame for three heartbeat intervals")
                return
            except GRPCError:
                await self._close(session, "protocol", "a frame was refused")
                return
            if frame is None:
                return
            session.heard = time.monotonic()
            self._heard.add(session.node_id)
            kind, content = betterproto2.which_one_of(frame, "frame")
            if kind == "hello":
                await self._close(session, "protocol", "Hello was sent twice")
                return
            if isinstance(content, wire.CommandResult):
                await self._take_result(session, content)
            elif isinstance(content, wire.InventorySection):
                await self._take_inventory(session, content)
            elif isinstance(content, wire.NodeEvent):
                await self._take_event(session, content)
            elif isinstance(content, wire.DesiredStateAck):
                sent = session.sent_generation or 0
                if 0 < content.observed_generation <= sent:  # only what was sent on this session
                    self._acks[session.node_id] = max(self._acks.get(session.node_id, 0), content.observed_generation)
                    self._ack_wake.set()

    async def _take_inventory(self, session: _Session, section: wire.InventorySection) -> None:
        """Keep a reported inventory section and publish ``node.inventory_reported``; an unknown section, or content
        that is not JSON PostgreSQL can store, is dropped and logged (the session goes on)."""
        if section.section not in INVENTORY_SECTIONS:
            log.warning("node %s: dropped an inventory section of an unknown name", session.node_id)
            return
        try:
            content = _json_value(section.content_json, "content_json")
            async with self._store.transaction() as tx:
                if await tx.repository(NODES).record_inventory(
                    session.node_id, section.section, content, fake=section.fake
                ):
                    payload = {"node_id": session.node_id, "section": section.section, "fake": section.fake}
                    await tx.publish([OutboxEvent(type=INVENTORY_REPORTED, key=session.node_id, payload=payload)])
                    await tx.enqueue([inventory_item(session.node_id)])
        except ComputeError as exc:
            log.warning("node %s: inventory section %s not kept: %s", session.node_id, section.section, exc.code)

    async def _take_event(self, session: _Session, event: wire.NodeEvent) -> None:
        """Publish what the daemon reports (``node.reported``, with its type and payload); at most
        ``_EVENTS_PER_MINUTE`` a minute per session, and a malformed one is dropped and logged."""
        now = time.monotonic()
        if now - session.events_since > 60:
            session.events_since, session.events = now, 0
        session.events += 1
        if session.events > _EVENTS_PER_MINUTE:
            if session.events == _EVENTS_PER_MINUTE + 1:
                log.warning("node %s: more than %d events a minute; dropping", session.node_id, _EVENTS_PER_MINUTE)
            return
        if len(event.type) > 128 or not _EVENT_TYPE.fullmatch(event.type):
            log.warning("node %s: dropped an event with a malformed type", session.node_id)
            return
        try:
            body = _json_object(event.payload_json or "{}", "payload_json")
            payload = {"node_id": session.node_id, "type": event.type, "payload": body, "at_ms": event.at_ms}
            async with self._store.transaction() as tx:
                await tx.publish([OutboxEvent(type=NODE_REPORTED, key=session.node_id, payload=payload)])
        except ComputeError as exc:
            log.warning("node %s: event %s not published: %s", session.node_id, event.type, exc.code)

    async def _take_result(self, session: _Session, result: wire.CommandResult) -> None:
        """Record a command's result, once its node's signature over it verifies; refuse (and log) it otherwise."""
        kind = session.commands.get(result.command_id)
        why = None
        if kind is None or kind != result.kind:
            why = "not a command dispatched on this session"
        elif result.epoch != session.epoch:
            why = "signed for another session"
        elif result.outcome not in ("succeeded", "failed"):
            why = "an outcome other than succeeded or failed"
        else:
            message = wire.command_result_message(
                command_id=result.command_id,
                kind=result.kind,
                outcome=result.outcome,
                result_json=result.result_json,
                epoch=result.epoch,
            )
            try:
                verify_signature(session.public_key, result.signature, message)
                body = _json_object(result.result_json, "result_json")
            except ComputeError as exc:
                why = "a bad signature" if exc.details.get("reason") == "bad_signature" else "a malformed result"
        if why is not None:
            log.warning("node %s: refused a result for command %s: %s", session.node_id, result.command_id[:64], why)
            return
        reason = body.get("reason") if result.outcome == "failed" else None
        try:
            async with self._store.transaction() as tx:
                finished = await tx.repository(COMMANDS).finish(
                    id=result.command_id,
                    epoch=session.epoch,
                    state=result.outcome,
                    result=body,
                    reason=reason if isinstance(reason, str) else None,
                )
                if finished is not None and finished.wake is not None:
                    await tx.enqueue([finished.wake])  # whoever asked for the command hears of it at once
        except ComputeError as exc:  # text the database cannot hold (a NUL), or the database away: not recorded
            log.warning(
                "node %s: result for command %s not recorded: %s", session.node_id, result.command_id[:64], exc.code
            )
            return
        del session.commands[result.command_id]
        if finished is None:
            log.info("node %s: command %s was no longer waiting for a result", session.node_id, result.command_id)

    async def _send(self, session: _Session, frame: wire.ControlFrame) -> None:
        """Send a frame, or close the session as ``slow`` when the daemon does not read it in time (HTTP/2 flow
        control holds a frame back while the daemon's window is full)."""
        try:
            async with asyncio.timeout(self.options.send_timeout):
                async with session.sends:
                    await session.stream.send_message(frame)
        except TimeoutError:
            await self._close(session, "slow", "the daemon did not read its frames in time")
            raise StreamTerminatedError("the daemon did not read its frames") from None

    def _deliver(self, session: _Session, frame: wire.ControlFrame) -> None:
        """Send a frame from the flush loop without waiting for it: a daemon that reads slowly delays only its own
        frames (in order), never the loop or other sessions; past ``_MAX_QUEUED`` frames waiting it is closed."""
        if session.closing is not None:
            return
        if session.queued >= _MAX_QUEUED:
            self._spawn(self._close(session, "slow", "the daemon did not read its frames in time"))
            return
        session.queued += 1
        self._spawn(self._deliver_one(session, frame))

    async def _deliver_one(self, session: _Session, frame: wire.ControlFrame) -> None:
        try:
            with contextlib.suppress(Exception):  # a session that cannot take it ends
                await self._send(session, frame)
        finally:
            session.queued -= 1

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def _close(self, session: _Session, reason: str, message: str) -> None:
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

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.options.liveness_flush_interval)
            before = self.serving
            try:
                await self._flush()
                await self._close_revoked()
                await self._dispatch()
                await self._push_desired()  # reads the database every pass: it is the health probe too
                self._database_ok = True
            except Exception as exc:  # a database outage: the next pass does what this one missed
                self._database_ok = False
                log.warning("liveness or revocations not handled: %s", type(exc).__name__)
            self._health_may_have_changed(before)

    async def _ack_loop(self) -> None:
        """Write acknowledgements as they arrive rather than with the next liveness flush, so what waits on one (a
        reservation binding) hears of it in milliseconds instead of up to ``liveness_flush_interval``. The acks of
        one change (a desired state sent to many nodes) arrive together: they are gathered for
        ``ACK_GATHER_SECONDS`` and written in one statement. A write that fails leaves them to the flush loop."""
        while True:
            await self._ack_wake.wait()
            self._ack_wake.clear()
            await asyncio.sleep(ACK_GATHER_SECONDS)
            try:
                await self._write_acks()
            except Exception as exc:
                log.debug("acknowledgements not written now (%s); the flush loop tries again", type(exc).__name__)

    async def _listen_desired(self) -> None:
        """Push desired states as soon as a poke says one changed; reconnect with backoff (polling covers the
        gaps, so nothing is lost while this is down)."""
        assert self._notifier is not None
        delay = 1.0
        while True:
            try:
                async with self._notifier.listen(DESIRED_STATE_CHANNEL) as pokes:
                    delay = 1.0
                    async for _ in pokes:
                        with contextlib.suppress(Exception):
                            await self._push_desired()
            except Exception as exc:
                log.info("desired-state pokes not heard (%s); polling meanwhile", type(exc).__name__)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)

    async def _push_desired(self) -> None:
        """Send each live session the node's desired state when its generation is newer than the one sent: the
        changes dated since the last read (one indexed statement), the new sessions' current ones, and every
        ``desired_sweep_interval`` a comparison for all sessions (one statement each)."""
        async with self._desired_lock:
            nodes = self._store.repository(NODES)
            # The first read only learns the database's time: the sessions' own lookups cover what came before.
            changed, read_at = await nodes.desired_since(self._desired_since or _NEVER)
            self._desired_since = read_at - dt.timedelta(seconds=_DESIRED_LOOKBACK)
            live = {s.node_id: s for s in self._sessions.values() if s.closing is None}
            now = time.monotonic()
            if now >= self._desired_sweep_at:
                self._desired_sweep_at = now + self.options.desired_sweep_interval
                asked = list(live.values())
            else:
                asked = [s for s in live.values() if s.sent_generation is None]
            if asked:
                changed += await nodes.desired_newer([(s.node_id, s.sent_generation or 0) for s in asked])
            for session in asked:
                if session.sent_generation is None:
                    session.sent_generation = 0
            for desired in sorted(changed, key=lambda d: d.generation):
                target = live.get(desired.node_id)
                if target is not None and desired.generation > (target.sent_generation or 0):
                    self._send_desired(target, desired)

    def _send_desired(self, session: _Session, desired: DesiredState) -> None:
        frame = wire.DesiredState(
            generation=desired.generation, content_json=json.dumps(dict(desired.content), separators=(",", ":"))
        )
        session.sent_generation = desired.generation  # a session that cannot take it ends; its next one gets it
        self._deliver(session, wire.ControlFrame(desired_state=frame))

    async def _dispatch(self) -> None:
        """Send the sessions' pending commands: one statement takes them for every session at once."""
        live = {s.node_id: s for s in self._sessions.values() if s.closing is None}
        if not live:
            return
        commands = await self._store.repository(COMMANDS).dispatch_many(
            [(s.node_id, s.epoch) for s in live.values()], now=self._services.clock.now(), limit=16
        )
        for command in commands:
            session = live[command.node_id]
            session.commands[command.id] = command.kind
            frame = wire.Command(
                id=command.id,
                kind=command.kind,
                arguments_json=json.dumps(dict(command.payload), separators=(",", ":")),
                deadline_ms=_ms(command.deadline.timestamp()),
            )
            self._deliver(session, wire.ControlFrame(command=frame))  # a session that cannot take it ends; the sweeper
            # settles the command as its ``on_session_loss`` says

    async def _close_revoked(self) -> None:
        """Close the sessions whose certificate was revoked (a node revoked or retired): one statement for all of
        them, each flush, so a revocation ends its session within about two flush intervals whatever happens to
        events."""
        sessions = {s.serial: s for s in self._sessions.values() if s.closing is None}
        if not sessions:
            return
        # A session lives no longer than the certificate it opened with; the daemon renewed it meanwhile and opens
        # its next session with the new one.
        now = self._services.clock.now().timestamp()
        for session in [s for s in sessions.values() if s.not_after <= now]:
            log.info("node %s: the certificate of session %d expired, closing it", session.node_id, session.epoch)
            await self._close(session, "certificate_expired", "the session's certificate expired; reconnect")
            del sessions[session.serial]
        for serial in await self._store.repository(CERTIFICATES).revoked_among(list(sessions)):
            session = sessions[serial]
            log.info("node %s: certificate %s revoked, closing its session", session.node_id, serial)
            self._metrics.gateway_revocations_applied.inc()
            await self._close(session, "revoked", "the node's certificate was revoked")

    async def _flush(self) -> None:
        """Write that the sessions heard from since the last flush are alive: one statement for all of them; and
        the desired-state generations daemons acknowledged that ``_ack_loop`` has not written yet."""
        heard, self._heard = self._heard, set()
        alive = [(node_id, s.epoch) for node_id in heard if (s := self._sessions.get(node_id)) is not None]
        if alive:
            try:
                current = set(await self._store.repository(SESSIONS).seen(alive, gateway=self.options.name))
            except BaseException:
                self._heard |= heard
                raise
            # A session the database no longer counts as current (the SessionSweeper gave it up while this gateway
            # could not report it, or the node is gone) is closed: the daemon's next session starts clean.
            for node_id, epoch in alive:
                session = self._sessions.get(node_id)
                if node_id not in current and session is not None and session.epoch == epoch:
                    self._spawn(self._close(session, "stale", "the control plane no longer counts this session"))
        await self._write_acks()

    async def _write_acks(self) -> None:
        """The desired-state generations acknowledged since the last write, in one transaction (none: nothing)."""
        acks, self._acks = self._acks, {}
        if acks:
            try:
                # What waits on an acknowledgement (a reservation binding) hears of it in the same transaction.
                async with self._store.transaction() as tx:
                    moved = await tx.repository(NODES).observe(list(acks.items()))
                    if moved:
                        await tx.enqueue([acked_item(node_id) for node_id in moved])
            except BaseException:
                for node_id, generation in acks.items():
                    self._acks[node_id] = max(self._acks.get(node_id, 0), generation)
                raise


class _Tracked(H2Protocol):
    """grpclib's protocol for one connection, which keeps its transport in the server's set while it is open and
    lowers HTTP/2's stream limit. One class for every connection: a class made per connection cost each session a
    type object and its closures (about 2 KB, and more work for the garbage collector)."""

    def __init__(self, *args: Any, transports: set[asyncio.BaseTransport], max_streams: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._transports = transports
        self._max_streams = max_streams
        self.kept: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.kept = transport
        self._transports.add(transport)
        super().connection_made(transport)
        # h2 allows 100 concurrent streams per connection; a daemon needs a few.
        self.connection._connection.update_settings({SettingCodes.MAX_CONCURRENT_STREAMS: self._max_streams})
        self.connection.flush()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.kept is not None:
            self._transports.discard(self.kept)
        super().connection_lost(exc)


class _Server(Server):
    """grpclib's server, keeping its connections so that closing the gateway closes them too (grpclib stops
    listening and cancels handlers, but leaves the connections to the clients)."""

    def __init__(self, handlers: list[Any], *, config: Configuration, max_streams: int) -> None:
        super().__init__(handlers, config=config)
        self._transports: set[asyncio.BaseTransport] = set()
        self._max_streams = max_streams

    def _protocol_factory(self) -> H2Protocol:
        # grpclib's own factory (a handler per connection), with the transport kept when the connection is made.
        self.__gc_step__()
        handler = ConnectionHandler(self._mapping, self._codec, self._status_details_codec, self.__dispatch__)
        self._handlers.add(handler)
        return _Tracked(
            handler, self._config, self._h2_config, transports=self._transports, max_streams=self._max_streams
        )

    def drop_connections(self) -> None:
        # Aborted, not closed: a close waits for the write buffer to drain, which a client that stopped reading
        # never lets happen (the socket would outlive the gateway).
        for transport in list(self._transports):
            if isinstance(transport, asyncio.WriteTransport):
                transport.abort()
            else:
                transport.close()
        self._transports.clear()


def create_gateway(
    services: GatewayServices,
    store: Store,
    tls: GatewayTls,
    options: GatewayOptions | None = None,
    *,
    notifier: Notifier | None = None,
    metrics: Metrics | None = None,
) -> Gateway:
    """A gateway for the control plane's ``services`` (``compute.gateway_services``) and ``store``: ``await
    gateway.start(host, port)`` to listen. It holds no CA and no JoinService key: ``Join``, ``Renew`` and
    ``Secret`` are decided by ``services``. With a ``notifier`` (the control plane's), desired states are pushed as
    soon as they change rather than at the next liveness flush. With ``metrics`` (``compute.metrics``), its sessions,
    handshakes and applied revocations are counted there (``bettercompute_gateway_*``)."""
    return Gateway(services, store, tls, options or GatewayOptions(), notifier, metrics)


@overload
def _client_certificate(stream: Stream[Any, Any]) -> str: ...
@overload
def _client_certificate(stream: Stream[Any, Any], *, required: bool) -> str | None: ...
def _client_certificate(stream: Stream[Any, Any], *, required: bool = True) -> str | None:
    """The PEM of the connection's client certificate (verified against the trust bundle by the handshake).

    Raises:
        UnauthenticatedError: the connection presented none and ``required``.
    """
    transport = stream.peer._transport
    ssl_object = transport.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        if not required:
            return None
        raise UnauthenticatedError(
            "this call needs the node's client certificate", details={"reason": "no_certificate"}
        )
    return x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM).decode()


def _certificate(result: JoinResult | RenewResult) -> wire.Certificate:
    """A joined or renewed node's certificate, as the wire carries it."""
    return wire.Certificate(
        node_id=result.node_id,
        spiffe_id=result.spiffe_id,
        certificate_pem=result.certificate_pem,
        chain_pem=result.chain_pem,
        trust_bundle_pem=result.trust_bundle_pem,
        serial=result.serial,
        not_after_ms=_ms(result.not_after.timestamp()),
    )


def _json_value(text: str, path: str) -> Any:
    """Any JSON value from the wire, refused when it does not parse or holds text PostgreSQL cannot store.

    Raises:
        InvalidInputError: either.
    """
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError):
        raise InvalidInputError(f"{path}: not JSON", details={"path": path}) from None
    if not storable_json(value):
        raise InvalidInputError(
            f"{path}: holds a NUL character or an unpaired surrogate", details={"path": path, "reason": "unstorable"}
        )
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number too large")
    return value


def _json_object(text: str, path: str) -> dict[str, Any]:
    """A JSON object from the wire, refused when it is not one or holds text PostgreSQL cannot store (a NUL, an
    unpaired surrogate from a ``\\ud800`` escape), anywhere, keys included.

    Raises:
        InvalidInputError: either.
    """
    try:
        # NaN, Infinity and numbers too large for a float (1e999) are refused: PostgreSQL's jsonb cannot hold them.
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise InvalidInputError(f"{path}: expected a JSON object", details={"path": path})
    if not storable_json(value):
        raise InvalidInputError(
            f"{path}: holds a NUL character or an unpaired surrogate", details={"path": path, "reason": "unstorable"}
        )
    return value


_NEVER = dt.datetime(9999, 1, 1, tzinfo=dt.UTC)


def _ms(seconds: float) -> int:
    return round(seconds * 1000)
