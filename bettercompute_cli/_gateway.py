"""Hosting the gateway in a ``serve`` or ``dev`` process: its server certificate from the control plane's CA (the one
daemons trust since they joined), renewed before it expires, and the gateway itself."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
from pathlib import Path
from typing import Any

import attrs

from bettercompute import BetterCompute
from bettercompute.errors import InvalidConfigError
from bettercompute_gateway import (
    Gateway,
    GatewayIdentity,
    GatewayOptions,
    GatewayServicesPort,
    GatewayTls,
    InternalListener,
    TunnelOptions,
    create_gateway,
    issue_tls,
)

__all__ = [
    "CLOSE_DRAIN_SECONDS",
    "DRAIN_SIGNAL",
    "GatewayPlan",
    "HostedGateway",
    "HostedListener",
    "RemotePlan",
    "loop_options",
]

log = logging.getLogger("bettercompute.cli")

_NAME = re.compile(r"[^A-Za-z0-9._-]+")

DRAIN_SIGNAL = signal.SIGUSR1
"""Drains the gateway of a running ``serve`` or ``dev``: health answers NOT_SERVING, no new session is taken, and the
sessions held are closed (reason ``draining``) over ``GatewayOptions.drain_period``; the process goes on serving the
rest until it is stopped."""
CLOSE_DRAIN_SECONDS = 5.0
"""Over how long a stopping process closes its gateway's sessions, when it was not drained before."""


@attrs.frozen(kw_only=True)
class RemotePlan:
    """How a gateway-only process reaches the api process's internal listener, and where it keeps its identity."""

    addresses: tuple[tuple[str, int], ...]
    trust_domain: str
    state_dir: Path
    token: str | None = attrs.field(default=None, repr=False)


@attrs.frozen(kw_only=True)
class GatewayPlan:
    """Where the gateway listens, the names its certificate is valid for (what daemons dial), and, for a gateway
    without the api in its process, how it reaches the api (``None``: the control plane in this process)."""

    listen_host: str
    port: int
    hosts: tuple[str, ...]
    name: str
    tunnels: TunnelOptions = attrs.field(factory=TunnelOptions)
    remote: RemotePlan | None = None


def loop_options(plan: GatewayPlan | None) -> dict[str, Any]:
    """``anyio.run``'s backend options for a process that runs ``plan``: uvloop when it hosts the gateway and uvloop
    is installed (the ``gateway`` extra), as DESIGN says the gateway runs; asyncio's own loop otherwise. The stdlib
    loop keeps a 256 KiB TLS buffer per connection, so thousands of daemons cost about four times the memory."""
    if plan is None:
        return {}
    try:
        import uvloop  # noqa: F401 - an optional dependency: only whether it is there matters
    except ImportError:
        return {}
    return {"use_uvloop": True}


def loop_name() -> str:
    """``uvloop`` or ``asyncio``: the event loop this process runs on."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"


def gateway_name(instance: str) -> str:
    """A gateway name made of the process's instance name (letters, digits, '.', '_' and '-' only)."""
    return (_NAME.sub("-", instance).strip("-") or "gateway")[:128]


class HostedGateway:
    """The gateway of this process: ``await start()``, then ``await close()``."""

    def __init__(self, compute: BetterCompute, plan: GatewayPlan) -> None:
        self._compute = compute
        self._plan = plan
        self.gateway: Gateway | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._draining: asyncio.Task[None] | None = None
        self._signal = False
        self._identity: GatewayIdentity | None = None
        if plan.remote is not None:
            self._identity = GatewayIdentity(
                plan.remote.state_dir,
                name=plan.name,
                hosts=plan.hosts,
                addresses=plan.remote.addresses,
                trust_domain=plan.remote.trust_domain,
                token=plan.remote.token,
            )

    async def _certificate(self) -> tuple[GatewayTls, float]:
        """A fresh server certificate (and when to renew it, in seconds: at two thirds of its life)."""
        if self._identity is not None:
            return await self._identity.renew()
        return await issue_tls(self._compute.gateway_services, name=self._plan.name, hosts=self._plan.hosts)

    async def start(self) -> None:
        store = self._compute.options.store
        if store is None:  # a control plane that serves JoinService has a store
            raise InvalidConfigError("the gateway needs the control plane's store")
        services: GatewayServicesPort
        if self._identity is not None:
            services, tls, renew_in = await self._identity.open()
        else:
            services = self._compute.gateway_services
            tls, renew_in = await self._certificate()
        gateway = create_gateway(
            services,
            store,
            tls,
            GatewayOptions(name=self._plan.name, tunnels=self._plan.tunnels),
            notifier=self._compute.options.notifier,
            metrics=self._compute.metrics,
        )
        await gateway.start(self._plan.listen_host, self._plan.port)
        self.gateway = gateway
        self._renewer = asyncio.create_task(self._renew(renew_in), name="gateway-certificate")
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
            asyncio.get_running_loop().add_signal_handler(DRAIN_SIGNAL, self._drain_requested)
            self._signal = True
        log.info(
            "gateway %s listening on %s:%d (certificate for %s; event loop %s)",
            self._plan.name,
            self._plan.listen_host,
            self._plan.port,
            ", ".join(self._plan.hosts),
            loop_name(),
        )

    async def _renew(self, delay: float) -> None:
        while True:
            await asyncio.sleep(delay)
            try:
                tls, delay = await self._certificate()
                if self.gateway is not None:
                    self.gateway.reload_tls(tls)
                log.info("gateway %s: server certificate renewed", self._plan.name)
            except Exception as exc:  # try again soon; the old certificate is still valid for a third of its life
                log.warning("gateway %s: server certificate not renewed: %s", self._plan.name, type(exc).__name__)
                delay = 60.0

    def _drain_requested(self) -> None:
        log.info("gateway %s: %s received, draining", self._plan.name, DRAIN_SIGNAL.name)
        if self.gateway is not None and not self.gateway.draining and self._draining is None:
            self._draining = asyncio.create_task(self.gateway.drain(), name="gateway-drain")

    async def close(self) -> None:
        """Stop: sessions are drained over a few seconds (all at once would send every daemon to the other gateways
        in the same instant), then the gateway closes."""
        if self._signal:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(DRAIN_SIGNAL)
            self._signal = False
        if self.gateway is not None and self._draining is None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.gateway.drain(period=CLOSE_DRAIN_SECONDS), CLOSE_DRAIN_SECONDS + 5)
        draining, self._draining = self._draining, None
        if draining is not None:
            draining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await draining
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            await gateway.close()
        if self._identity is not None:
            self._identity.close()


class HostedListener:
    """The internal listener of an api process: gateway processes reach the control plane's gateway services
    through it. Its certificate (role ``control``) comes from the CA in this process and is renewed here."""

    def __init__(self, compute: BetterCompute, *, host: str, port: int, name: str) -> None:
        self._listener = InternalListener(compute.gateway_services, name=name, hosts=_listener_hosts(host))
        self._host = host
        self._port = port
        self.port: int | None = None

    async def start(self) -> None:
        self.port = await self._listener.start(self._host, self._port)
        log.info("internal listener for gateways on %s:%d", self._host, self.port)

    async def close(self) -> None:
        await self._listener.close()


_WILDCARDS = frozenset({"0.0.0.0", "::"})  # noqa: S104 - names to leave out of a certificate, not to bind


def _listener_hosts(host: str) -> tuple[str, ...]:
    """The names the listener's certificate carries (gateways check its SPIFFE ID, not these)."""
    return tuple(dict.fromkeys([h for h in (host, "localhost", "127.0.0.1", "::1") if h not in _WILDCARDS]))
