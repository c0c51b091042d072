"""The gateway: daemons' ``Join``, ``Renew`` and ``Secret`` relayed to the control plane's services, their
``Session`` streams held in memory, and tunnels carried between clients and nodes.

One part per job, wired by ``_compose``:

- ``Sessions`` (``_sessions``): the session table, sending to and closing sessions;
- ``SessionStream`` (``_session_stream``) and ``Epochs`` (``_epochs``): a ``Session`` stream from admission to its
  end, and its epoch in the control plane;
- ``Ingest`` (``_ingest``): results, inventory, events and acknowledgements written to the control plane;
- ``DesiredPush`` (``_desired``) and ``CommandDispatch`` (``_dispatch``): what is sent down the sessions;
- ``Liveness`` (``_liveness``): the flush loop, liveness written in batches, then the other periodic work;
- ``RevocationWatch`` (``_revocation``): sessions of revoked or expired certificates closed;
- ``ServiceRelay`` (``_relay``): ``Join``, ``Renew``, ``Secret`` and ``Call`` relayed;
- ``Health`` (``_health``), ``ServerTls`` (``_tls``), ``TunnelRelay`` (``_tunnels``) and the grpclib server
  (``_server``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
from grpclib.const import Cardinality, Handler
from grpclib.server import Stream

import bettercompute_proto as wire
from bettercompute import Metrics
from bettercompute.ports import Notifier, Store
from bettercompute_proto import health

from ._desired import DesiredPush
from ._dispatch import CommandDispatch
from ._epochs import Epochs
from ._health import Health
from ._ingest import Ingest
from ._liveness import Liveness
from ._options import GatewayOptions
from ._port import GatewayServicesPort
from ._relay import ServiceRelay
from ._revocation import RevocationWatch
from ._server import GatewayServer, listen
from ._session_stream import SessionStream
from ._sessions import Sessions
from ._signers import SignerCertificates
from ._tls import GatewayTls, ServerTls
from ._tunnels import TunnelRelay
from ._wire import receive

__all__ = ["Gateway", "create_gateway"]

log = logging.getLogger("bettercompute.gateway")


@attrs.frozen(kw_only=True)
class _Parts:
    """The gateway's parts, one per job."""

    tls: ServerTls
    sessions: Sessions
    health: Health
    ingest: Ingest
    liveness: Liveness
    desired: DesiredPush
    relay: ServiceRelay
    stream: SessionStream
    tunnels: TunnelRelay


def _compose(
    services: GatewayServicesPort, store: Store, tls: GatewayTls, options: GatewayOptions, metrics: Metrics
) -> _Parts:
    """The gateway's parts, each handed the others it works with; the flush loop's steps run in this order."""
    most = options.max_message_bytes
    sessions = Sessions(send_timeout=options.send_timeout)
    health = Health(name=options.name, most=most)
    ingest = Ingest(store)
    signers = SignerCertificates(store)
    desired = DesiredPush(store, sessions, signers, gateway=options.name, sweep_interval=options.desired_sweep_interval)
    steps = [
        ingest.write_acks,  # what the acknowledgement writer has not written yet
        RevocationWatch(store, sessions, services.clock, metrics).check,
        CommandDispatch(store, sessions, signers).dispatch,
        desired.push,  # reads the database every pass: it is the health probe too
    ]
    return _Parts(
        tls=ServerTls(tls),
        sessions=sessions,
        health=health,
        ingest=ingest,
        liveness=Liveness(
            store, sessions, health, gateway=options.name, interval=options.liveness_flush_interval, steps=steps
        ),
        desired=desired,
        relay=ServiceRelay(services, most=most),
        stream=SessionStream(
            services,
            options,
            epochs=Epochs(store, gateway=options.name),
            sessions=sessions,
            ingest=ingest,
            health=health,
            metrics=metrics,
        ),
        tunnels=TunnelRelay(
            services,
            options.tunnels,
            receive=lambda stream, limit: receive(
                stream, wire.TunnelFrame, most if limit is None else min(limit, most)
            ),
            session_of=sessions.live_one,
            send_control=sessions.send,
            draining=lambda: health.draining,
            metrics=metrics,
        ),
    )


class Gateway:
    """A gateway: ``await gateway.start(host, port)``, then ``await gateway.close()``. Made by ``create_gateway``."""

    def __init__(
        self,
        services: GatewayServicesPort,
        store: Store,
        tls: GatewayTls,
        options: GatewayOptions,
        notifier: Notifier | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.options = options
        # Without the control plane's, a registry of the gateway's own that nothing serves: recording stays uniform.
        self._metrics = metrics or Metrics()
        self._notifier = notifier
        self._parts = _compose(services, store, tls, options, self._metrics)
        self._sessions = self._parts.sessions.by_node
        self._server: GatewayServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.port: int | None = None

    @property
    def _tls(self) -> GatewayTls:
        return self._parts.tls.tls

    @property
    def tunnels(self) -> Mapping[str, str]:
        """The tunnels open through this gateway now: tunnel id -> node id."""
        return self._parts.tunnels.open

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
        parts = self._parts
        self._server, self.port = await listen([self], self.options, host, port, parts.tls.open())
        sessions = self._sessions
        self._metrics.gateway_sessions.set_function(lambda: len(sessions))  # read at scrape time
        self._tasks = [
            asyncio.create_task(parts.liveness.run(), name="gateway-liveness"),
            asyncio.create_task(parts.ingest.run(), name="gateway-acks"),
            asyncio.create_task(parts.tunnels.run(), name="gateway-tunnel-checks"),
        ]
        if self._notifier is not None:
            listening = parts.desired.listen(self._notifier)
            self._tasks.append(asyncio.create_task(listening, name="gateway-desired-pokes"))
        log.info("gateway %s listening on %s:%s", self.options.name, host, self.port)
        return self.port

    def reload_tls(self, tls: GatewayTls) -> None:
        """Use a new server certificate (and trust bundle) for the connections made from now on.

        Raises:
            ssl.SSLError: it does not load (the old one stays in use).
        """
        self._parts.tls.reload(tls)

    @property
    def serving(self) -> bool:
        """What the health service says: serving unless draining or the database could not be reached by the last
        pass of the flush loop."""
        return self._parts.health.serving

    @property
    def draining(self) -> bool:
        """Whether ``drain`` was called: no new session is taken."""
        return self._parts.health.draining

    async def drain(self, *, period: float | None = None) -> None:
        """Stop taking sessions (health answers NOT_SERVING, so load balancers send daemons elsewhere), then close
        the sessions held with reason ``draining``, spread evenly over ``period`` (``options.drain_period``): the
        daemons reconnect, through the load balancer, to the other gateways a few at a time. Calls other than
        ``Session`` are still answered. Returns when the last session is closed."""
        self._parts.health.drain()
        sessions = list(self._parts.sessions.live().values())
        period = self.options.drain_period if period is None else period
        pause = period / len(sessions) if sessions else 0.0
        log.info("gateway %s draining %d sessions over %.0f s", self.options.name, len(sessions), period)
        for index, session in enumerate(sessions):
            if index and pause:
                await asyncio.sleep(pause)
            await self._parts.sessions.close(session, "draining", "this gateway is draining; reconnect to another")

    async def close(self, *, reason: str = "draining") -> None:
        """Close every tunnel and session with ``reason`` at once, stop listening, and write the last liveness.
        Idempotent."""
        parts = self._parts
        parts.tunnels.close_all(reason)
        for session in list(self._sessions.values()):
            await parts.sessions.close(session, reason, "the gateway is closing")
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
            server.drop_connections()
        tasks, self._tasks = self._tasks, []
        for task in [*tasks, *parts.sessions.spawned]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if tasks:
            with contextlib.suppress(Exception):
                await parts.liveness.flush()
                await parts.ingest.write_acks()

    def __mapping__(self) -> dict[str, Handler]:
        """grpclib's table of the gateway's calls, each a raw handler (``_wire`` says why)."""
        parts = self._parts
        relay = parts.relay

        def unary(handler: Callable[[Stream[Any, Any]], Awaitable[None]], request: type, reply: type) -> Handler:
            return Handler(handler, Cardinality.UNARY_UNARY, request, reply)

        path = f"/{wire.SERVICE}/"
        return {
            path + "Join": unary(relay.join, wire.JoinRequest, wire.JoinResponse),
            path + "TrustBundle": unary(relay.trust_bundle, wire.TrustBundleRequest, wire.TrustBundleResponse),
            path + "RenewChallenge": unary(
                relay.renew_challenge, wire.RenewChallengeRequest, wire.RenewChallengeResponse
            ),
            path + "Renew": unary(relay.renew, wire.RenewRequest, wire.RenewResponse),
            path + "Secret": unary(relay.secret, wire.SecretRequest, wire.SecretResponse),
            path + "Session": Handler(
                parts.stream.handle, Cardinality.STREAM_STREAM, wire.NodeFrame, wire.ControlFrame
            ),
            path + "Tunnel": Handler(
                parts.tunnels.handle, Cardinality.STREAM_STREAM, wire.TunnelFrame, wire.TunnelFrame
            ),
            path + "Call": unary(relay.call, wire.CallRequest, wire.CallResponse),
            f"/{health.SERVICE}/Check": unary(
                parts.health.check, health.HealthCheckRequest, health.HealthCheckResponse
            ),
            f"/{health.SERVICE}/Watch": Handler(
                parts.health.watch, Cardinality.UNARY_STREAM, health.HealthCheckRequest, health.HealthCheckResponse
            ),
        }


def create_gateway(
    services: GatewayServicesPort,
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
