"""Composing a control plane from the configuration, and running it in a process mode.

Worker roles run in a task of their own (``compute.run``). The HTTP app served here answers the ASGI lifespan itself
instead of letting ``compute.asgi`` initialize and close the control plane: the process has already initialized it
(with or without migrations, as ``--no-migrate`` says) before listening, and closes it after its worker roles have
stopped.

``serve`` uses the embedded IAM unless ``iam_url`` is configured; then it asks that central control plane's IAM
(``RemoteIam``) and registers none of IAM's groups or tables. ``dev``, ``migrate`` and ``iam bootstrap`` always
compose the embedded IAM.

``serve`` and ``dev`` also compose a ``PgNotifier``, so work enqueued in one process (and a worker joining or leaving)
wakes the worker loops of every process at once instead of at their next poll. LISTEN is session state, which
PgBouncer in transaction mode does not keep: behind it (``pgbouncer = true``) the notifier needs ``notify_url``, a
direct URL to the server; without one there is no notifier and the loops poll. The one-shot commands have none.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import signal
import socket
from collections.abc import Awaitable, Callable, Generator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import attrs
import uvicorn

from bettercompute import BetterCompute, JoinSettings, KmsRing, LocalKeyKms, Options, better_compute
from bettercompute.errors import (
    AccessDeniedError,
    ComputeError,
    InvalidConfigError,
    UnauthenticatedError,
    UnavailableError,
)
from bettercompute.modules.webhooks import WebhookSettings
from bettercompute.ports import Decision, Iam, Identity, Kms, ResourceRef
from bettercompute_gateway import TunnelOptions
from bettercompute_iam import EmbeddedIam, RemoteIam
from bettercompute_metal import MetalModule
from bettercompute_store_pg import PgNotifier, PgStore
from bettercompute_vps import VpsModule

from ._config import (
    API_ROLE,
    DATABASE_URL_ENV,
    GATEWAY_ROLE,
    IAM_CREDENTIAL_ENV,
    IAM_URL_ENV,
    WORKER_ROLES,
    Config,
    ConfigError,
)
from ._gateway import GatewayPlan, HostedGateway, HostedListener, RemotePlan, gateway_name
from ._reporting import display_host
from ._signals import STOP_SIGNALS, no_signal_reraise

__all__ = [
    "Plan",
    "build",
    "build_notifier",
    "build_serving",
    "close",
    "gateway_plan",
    "metrics_address",
    "notifier_note",
    "plan_roles",
    "require_embedded_iam",
    "run",
    "serve_workers",
]

log = logging.getLogger("bettercompute.cli")

_GRACEFUL_SHUTDOWN_SECONDS = 5


@attrs.frozen(kw_only=True)
class Plan:
    """What one process runs: the HTTP API or not, which worker roles, and the gateway or not."""

    api: bool
    workers: frozenset[str]
    gateway: GatewayPlan | None = None
    internal: tuple[str, int] | None = None
    """Where the api's internal listener for gateway processes listens (``None``: none)."""

    def describe(self) -> str:
        """``api + controllers, iam`` and the like, for logs."""
        parts = ([API_ROLE] if self.api else []) + sorted(self.workers) + ([GATEWAY_ROLE] if self.gateway else [])
        return ", ".join(parts)


def gateway_plan(config: Config, *, remote: bool = False) -> GatewayPlan | None:
    """Where this process's gateway listens: on ``gateway_host`` (else ``host``), at ``gateway_port`` (else the port
    of ``gateway_address``, the address daemons dial, which its certificate names, with ``localhost`` and the
    loopback addresses); ``None`` without node identity configured. With ``remote`` (a gateway without the api in
    its process), it reaches the api's internal listener at ``internal_address`` and holds no KMS key.

    Raises:
        ConfigError: ``remote`` without ``internal_address``, or with ``kms_key_file``.
    """
    if config.gateway_address is None or config.trust_domain is None:
        return None
    remote_plan = None
    if remote:
        remote_plan = _remote_plan(config)
    elif config.kms_key_file is None:
        return None
    host, _, port = config.gateway_address.rpartition(":")
    dialed = host.strip("[]")
    hosts = tuple(dict.fromkeys([dialed, "localhost", "127.0.0.1", "::1"]))
    name = gateway_name(config.instance or "gateway")
    listen_port = config.gateway_port if config.gateway_port is not None else int(port)
    tunnels = TunnelOptions(
        streams_per_tenant=config.tunnel_streams_per_tenant, bytes_per_second=config.tunnel_bytes_per_second
    )
    return GatewayPlan(
        listen_host=config.gateway_host or config.host,
        port=listen_port,
        hosts=hosts,
        name=name,
        tunnels=tunnels,
        remote=remote_plan,
    )


def _remote_plan(config: Config) -> RemotePlan:
    problems = []
    if config.internal_address is None:
        problems.append(
            "roles: a gateway without the api reaches the api's internal listener: set internal_address "
            "(the api process's internal_port)"
        )
    for key, value in (("kms_key_file", config.kms_key_file), ("kms_previous_key_file", config.kms_previous_key_file)):
        if value is not None:
            problems.append(
                f"{key}: a gateway without the api holds no KMS key; leave it out of this process's configuration"
            )
    if problems or config.internal_address is None or config.trust_domain is None:
        raise ConfigError(problems)
    addresses = []
    for address in config.internal_address.split(","):
        host, _, port = address.strip().rpartition(":")
        addresses.append((host.strip("[]"), int(port)))
    name = gateway_name(config.instance or "gateway")
    state_dir = config.gateway_state_dir
    if state_dir is None:
        base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
        state_dir = base / "better-compute" / f"gateway-{name}"
    return RemotePlan(
        addresses=tuple(addresses),
        trust_domain=config.trust_domain,
        state_dir=state_dir,
        token=config.gateway_token,
    )


def plan_roles(roles: tuple[str, ...], config: Config | None = None) -> Plan:
    """The plan for ``serve --roles``; ``all`` is the API, every worker role and, when node identity is configured
    (``trust_domain``, ``gateway_address``, ``kms_key_file``), the gateway. A gateway without the api reaches the
    api process's internal listener (``internal_address``) instead of holding the keys; an api process with node
    identity runs that listener when ``internal_port`` is set.

    Raises:
        ConfigError: The gateway role was asked for without node identity configured, or without the api and
            without ``internal_address`` (or with ``kms_key_file``).
    """
    api = "all" in roles or API_ROLE in roles
    gateway = None
    if config is not None and ("all" in roles or GATEWAY_ROLE in roles):
        gateway = gateway_plan(config, remote=not api)
    if GATEWAY_ROLE in roles and gateway is None:
        raise ConfigError(
            [
                "roles: the gateway role needs trust_domain and gateway_address, and kms_key_file with the api in "
                "the same process (node identity) or internal_address without it"
            ]
        )
    internal = None
    if api and config is not None and config.internal_port is not None and gateway_plan(config) is not None:
        internal = (config.internal_host or config.host, config.internal_port)
    if "all" in roles:
        return Plan(api=True, workers=frozenset(WORKER_ROLES), gateway=gateway, internal=internal)
    return Plan(
        api=api,
        workers=frozenset(r for r in roles if r in WORKER_ROLES),
        gateway=gateway,
        internal=internal,
    )


def metrics_address(config: Config) -> tuple[str, int] | None:
    """Where the metrics listener listens: ``(metrics_host or host, metrics_port)``; ``None`` without a
    ``metrics_port``."""
    if config.metrics_port is None:
        return None
    return (config.metrics_host or config.host, config.metrics_port)


def require_database_url(config: Config) -> str:
    """The configured database URL.

    Raises:
        ConfigError: None is configured.
    """
    if config.database_url is None:
        raise ConfigError(
            [
                f"no database is configured: set {DATABASE_URL_ENV} to a PostgreSQL URL (or database_url in the "
                "config file); `better-compute dev` starts an embedded PostgreSQL instead"
            ]
        )
    return config.database_url


def build_notifier(config: Config, url: str) -> PgNotifier | None:
    """The LISTEN/NOTIFY notifier: on ``notify_url`` when set, else on ``url`` unless ``pgbouncer`` is on.

    Through PgBouncer in transaction mode a LISTEN would hold on to no server session (the next transaction may run
    on another one), so pokes would be lost; without a direct URL there is no notifier and the loops poll.

    Raises:
        ConfigError: ``notify_url`` cannot be parsed.
    """
    if config.notify_url is not None:
        try:
            return PgNotifier(config.notify_url, schema=config.schema)
        except InvalidConfigError:
            # The URL may hold a password: name the key, not the value.
            raise ConfigError(["notify_url cannot be parsed as a PostgreSQL URL"]) from None
    if config.pgbouncer:
        return None
    return PgNotifier(url, schema=config.schema)


def notifier_note(config: Config) -> str | None:
    """A log line for a notifier that is not simply the database URL's, or for none at all."""
    if config.notify_url is not None:
        return "worker loops are woken by LISTEN/NOTIFY pokes over notify_url"
    if config.pgbouncer:
        return (
            "pgbouncer is on and notify_url is not set: no LISTEN/NOTIFY (LISTEN cannot go through a "
            "transaction-mode pooler), so worker loops find new work by polling, every second"
        )
    return None


def webhooks_note(config: Config, *, dev: bool) -> str | None:
    """A log line on where webhooks may be sent, when it is not simply "public destinations only"."""
    if config.webhooks_allow_private:
        return (
            "webhooks_allow_private is on: webhooks may be sent to loopback, private and link-local addresses, so any "
            "tenant that can create a webhook can make this process send requests into this network"
        )
    if dev:
        return (
            "dev allows webhooks to loopback destinations (127.0.0.1, ::1, localhost) for a receiver on this machine; "
            "other internal addresses stay refused, and serve refuses loopback too unless webhooks_allow_private is set"
        )
    return None


def _kms(config: Config) -> Kms | None:
    """The KMS of ``config``: its key file, and during a rotation the one it replaced for opening (``KmsRing``)."""
    if config.kms_key_file is None:
        return None
    current = LocalKeyKms(config.kms_key_file)
    if config.kms_previous_key_file is None:
        return current
    return KmsRing(current, LocalKeyKms(config.kms_previous_key_file))


def _compose(
    config: Config, url: str, iam: Iam, *, notify: bool, loopback_webhooks: bool = False, identity: bool = True
) -> BetterCompute:
    store = PgStore(url, schema=config.schema, prepared_statements=not config.pgbouncer)
    # With a key file, the webhooks group and its sinks/webhooks sender are registered (no I/O until first use).
    kms = _kms(config)
    # With the trust domain and gateway address as well, JoinService and the node CA are on (not in a gateway-only
    # process: it asks the api process for what they decide).
    join = None
    if identity and config.trust_domain is not None and config.gateway_address is not None:
        join = JoinSettings(
            gateway_address=config.gateway_address,
            trust_domain=config.trust_domain,
            tunnel_gateway=config.tunnel_gateway,
        )
    # Bare metal (sites, machines, the site's and the ramdisk's gateway methods) needs both: its agents get
    # certificates from the node CA, and BMC credentials are sealed by the KMS.
    # So do VPS instances: hosted ones run on nodes (node identity), a provider pool's credentials are a secret.
    modules: list[Any] = [MetalModule(), VpsModule()] if join is not None and kms is not None else []
    options = Options(
        store=store,
        iam=iam,
        instance=config.instance,
        kms=kms,
        join=join,
        modules=modules,
        notifier=build_notifier(config, url) if notify else None,  # connects on first use only
        lease_ttl=dt.timedelta(seconds=config.lease_ttl_seconds),
        max_queued=config.max_queued,
        webhooks=WebhookSettings(
            allow_private_destinations=config.webhooks_allow_private,
            allow_loopback_destinations=loopback_webhooks,
        ),
    )
    return better_compute(options)


def build(
    config: Config, url: str, *, notify: bool = False, loopback_webhooks: bool = False
) -> tuple[BetterCompute, EmbeddedIam]:
    """The control plane with the PostgreSQL store and the embedded IAM (``iam_url`` plays no part), and with
    ``LocalKeyKms(kms_key_file)`` (so the ``webhooks`` group) when a key file is configured.

    Args:
        config: The configuration.
        url: The database URL.
        notify: Compose the notifier (``build_notifier``), for a process that runs until stopped (``dev``).
        loopback_webhooks: Let webhooks reach this machine's loopback addresses (``dev``, for a receiver being
            built next to it); ``webhooks_allow_private`` allows every internal address.

    Raises:
        ConfigError: ``notify_url`` cannot be parsed.
        InvalidConfigError: The URL or the schema is malformed.
    """
    iam = EmbeddedIam()
    return _compose(config, url, iam, notify=notify, loopback_webhooks=loopback_webhooks), iam


class EdgeIam:
    """The ``Iam`` of a gateway-only process: it serves no API and decides nothing (what daemons ask is decided by
    the api process, over the internal channel), so it authenticates no one and reads nothing: its database role
    has no grant on the IAM's tables."""

    async def authenticate(self, credential: str) -> Identity:
        raise UnauthenticatedError("a gateway process authenticates no API credential")

    async def require(self, identity: Identity, action: str, resource: ResourceRef) -> Decision:
        raise AccessDeniedError("a gateway process decides nothing")


def build_serving(
    config: Config, url: str, *, identity: bool = True, edge_only: bool = False
) -> tuple[BetterCompute, RemoteIam | None]:
    """The control plane ``serve`` runs: with the central IAM at ``iam_url`` when configured, else embedded, and
    with the notifier (``build_notifier``). With ``edge_only`` (a gateway alone in its process), with ``EdgeIam``.

    The ``RemoteIam`` is returned so the caller closes its connections (``aclose()``) after the control plane.

    Raises:
        ConfigError: Only one of ``iam_url`` and ``iam_credential`` is set (``load_config`` already refuses this),
            or ``notify_url`` cannot be parsed.
        InvalidConfigError: The URL or the schema is malformed.
    """
    if edge_only:  # a gateway alone in its process: no IAM of any kind (``EdgeIam``)
        return _compose(config, url, EdgeIam(), notify=True, identity=False), None
    if config.iam_url is None and config.iam_credential is None:
        return _compose(config, url, EmbeddedIam(), notify=True, identity=identity), None
    if config.iam_url is None or config.iam_credential is None:
        raise ConfigError(
            [f"a central IAM needs both iam_url and iam_credential ({IAM_URL_ENV}, {IAM_CREDENTIAL_ENV})"]
        )
    remote = RemoteIam(config.iam_url, config.iam_credential)
    return _compose(config, url, remote, notify=True, identity=identity), remote


async def close(compute: BetterCompute) -> None:
    """Close the control plane, then its notifier's sending connection (the control plane does not own it)."""
    try:
        await compute.close()
    finally:
        notifier = compute.options.notifier
        if isinstance(notifier, PgNotifier):
            await notifier.close()


def require_embedded_iam(config: Config, command: str) -> None:
    """Refuse a command that administers the embedded IAM in a configuration that points at a central one.

    Raises:
        ConfigError: ``iam_url`` is configured.
    """
    if config.iam_url is not None:
        raise ConfigError(
            [
                f"iam_url is set, so this configuration uses the central IAM at {config.iam_url}; `{command}` runs "
                f"where IAM is embedded: run it with the central control plane's configuration (without iam_url)"
            ]
        )


def _listen(host: str, port: int) -> socket.socket:
    """Bind the listening socket ourselves, so a taken port is a clear error before anything else starts.

    The socket is made with the protocol getaddrinfo names (TCP): asyncio turns Nagle's algorithm off only on
    connections it can tell are TCP, and with it on, a keep-alive client waits for its delayed ACK (~40 ms) on
    every request after the first, since uvicorn writes a response's head and body apart.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, proto = infos[0][:3]
        sock = socket.socket(family, socket.SOCK_STREAM, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(infos[0][4])
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UnavailableError(f"cannot listen on {host}:{port}: {reason}") from exc
    return sock


Scope = MutableMapping[str, Any]

METRICS_PATH = "/metrics"


async def _not_found(scope: Scope, send: Any) -> None:
    """A ``NOT_FOUND`` envelope, as the API answers a path it does not route."""
    path = str(scope.get("path", ""))[:256]
    body = json.dumps(
        {"error": {"code": "NOT_FOUND", "message": "no route for this path", "details": {"path": path}}},
        separators=(",", ":"),
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": 404, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _HostedApp:
    """``compute.asgi`` with the lifespan answered here (see the module docstring for why). With ``metrics_apart``
    (``metrics_port`` is set), ``/metrics`` is served by the metrics listener only: here it is ``NOT_FOUND``."""

    def __init__(self, compute: BetterCompute, *, migrate: bool, metrics_apart: bool = False) -> None:
        self._compute = compute
        self._migrate = migrate
        self._metrics_apart = metrics_apart

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            if self._metrics_apart and scope["type"] == "http" and scope.get("path") == METRICS_PATH:
                await _not_found(scope, send)
                return
            await self._compute.asgi(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    # Already done by the process before listening; idempotent, so this only confirms it.
                    await self._compute.initialize(migrate=self._migrate)
                except ComputeError as exc:
                    await send({"type": "lifespan.startup.failed", "message": f"{exc.code}: {exc.message}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return


class _MetricsApp:
    """What the metrics listener serves: ``GET /metrics`` and ``GET /healthz`` through ``compute.asgi`` (so they
    answer exactly as on the API's port, and never with a traceback); anything else is ``NOT_FOUND``."""

    def __init__(self, compute: BetterCompute) -> None:
        self._compute = compute

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return  # uvicorn runs it with lifespan off; websockets are not served
        if scope.get("path") in (METRICS_PATH, "/healthz"):
            await self._compute.asgi(scope, receive, send)
        else:
            await _not_found(scope, send)


class _QuietServer(uvicorn.Server):
    """uvicorn's server, leaving the signals alone: the process's own handling (the API's server, or the signal
    receiver of a process without one) decides when to stop, and then stops this one too. ``settled`` is set once
    its startup is over, whether it listens or not."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.settled = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.settled.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class MetricsListener:
    """The metrics listener (``metrics_port``): a small uvicorn server in a task of its own, for as long as the
    process runs, in every process mode."""

    def __init__(self, compute: BetterCompute, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._sock = _listen(host, port)
        config = uvicorn.Config(app=_MetricsApp(compute), lifespan="off", log_config=None, access_log=False)
        self._server = _QuietServer(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen; returns once the server has started (or failed to).

        Raises:
            UnavailableError: it did not start.
        """
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]), name="metrics-listener")
        self._task.add_done_callback(lambda _: self._server.settled.set())
        await self._server.settled.wait()
        if not self._server.started:
            await self.close()
            raise UnavailableError(f"the metrics listener did not start on {self.host}:{self.port}")
        log.info("serving /metrics on http://%s:%d/metrics", display_host(self.host), self.port)

    async def close(self) -> None:
        """Stop listening. Idempotent."""
        self._server.should_exit = True
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(Exception, SystemExit):
                await asyncio.wait_for(task, _GRACEFUL_SHUTDOWN_SECONDS + 1)
        self._sock.close()


async def _host_workers(
    compute: BetterCompute,
    roles: frozenset[str],
    stop: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the worker roles in this task until ``stop`` is set (start and stop must share a task). With none (a
    gateway-only process), nothing joins the workers: such a process has no grant on their tables."""
    if not roles:
        task_status.started()
        await stop.wait()
        return
    await compute.start(roles)
    task_status.started()
    await stop.wait()
    await compute.stop()


class _Server(uvicorn.Server):
    """uvicorn's server, telling when it listens."""

    def __init__(self, config: uvicorn.Config, settled: anyio.Event) -> None:
        super().__init__(config)
        self._settled = settled

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._settled.set()


async def serve_http(
    compute: BetterCompute,
    plan: Plan,
    *,
    host: str,
    port: int,
    migrate: bool,
    access_log: bool,
    on_ready: Callable[[], None] | None = None,
    metrics_apart: bool = False,
) -> None:
    """Serve the HTTP API (and the plan's worker roles) until SIGINT or SIGTERM. ``initialize()`` must have run.
    With ``metrics_apart``, ``/metrics`` is left to the metrics listener (the API's port answers it ``NOT_FOUND``)."""
    sock = _listen(host, port)
    config = uvicorn.Config(
        app=_HostedApp(compute, migrate=migrate, metrics_apart=metrics_apart),
        lifespan="on",
        log_config=None,  # the root logger configured by the command formats uvicorn's records too
        access_log=access_log,
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_SECONDS,
    )
    settled = anyio.Event()  # startup finished, or the server gave up
    server = _Server(config, settled)
    stop_workers = anyio.Event()

    async def run_server() -> None:
        try:
            await server.serve(sockets=[sock])
        except SystemExit:
            # uvicorn exits the interpreter when the app's startup fails; here that is an error to report.
            raise UnavailableError("the HTTP server did not start") from None
        finally:
            settled.set()
            stop_workers.set()

    try:
        with no_signal_reraise():
            async with anyio.create_task_group() as tg:
                if plan.workers:
                    await tg.start(_host_workers, compute, plan.workers, stop_workers)
                tg.start_soon(run_server)
                await settled.wait()
                if server.started:
                    log.info("serving %s on http://%s:%d", plan.describe(), display_host(host), port)
                    if on_ready is not None:
                        on_ready()
    finally:
        sock.close()
    log.info("stopped")


async def serve_workers(compute: BetterCompute, plan: Plan, *, on_ready: Callable[[], None] | None = None) -> None:
    """Run worker roles only, until SIGINT or SIGTERM; then stop them, handing their leases back."""
    stop = anyio.Event()
    # The receiver stays open until the workers have stopped, so a second Ctrl-C does not interrupt the stop.
    with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
        async with anyio.create_task_group() as tg:
            await tg.start(_host_workers, compute, plan.workers, stop)
            log.info("running %s; stop with Ctrl-C or SIGTERM", plan.describe())
            if on_ready is not None:
                on_ready()
            async for signum in signals:
                log.info("received %s; stopping", signal.Signals(signum).name)
                break
            stop.set()
    log.info("stopped")


async def run(
    compute: BetterCompute,
    plan: Plan,
    *,
    host: str,
    port: int,
    migrate: bool,
    access_log: bool,
    on_ready: Callable[[], None] | None = None,
    before_close: Callable[[], Awaitable[None]] | None = None,
    metrics: tuple[str, int] | None = None,
) -> None:
    """Initialize the control plane, run the plan until a stop signal, then close it (after ``before_close``, which
    runs while the gateway and the store are still up). With ``metrics`` (``(metrics_host, metrics_port)``), the
    metrics listener runs meanwhile; it is bound first, so a taken port fails before anything starts."""
    hosted: HostedGateway | None = None
    internal: HostedListener | None = None
    listener = MetricsListener(compute, *metrics) if metrics is not None else None
    try:
        if listener is not None:
            await listener.start()
        await compute.initialize(migrate=migrate)
        if plan.internal is not None:
            name = gateway_name(compute.options.instance or socket.gethostname())
            internal = HostedListener(compute, host=plan.internal[0], port=plan.internal[1], name=name)
            await internal.start()
        if plan.gateway is not None:
            hosted = HostedGateway(compute, plan.gateway)
            await hosted.start()
        if plan.api:
            await serve_http(
                compute,
                plan,
                host=host,
                port=port,
                migrate=migrate,
                access_log=access_log,
                on_ready=on_ready,
                metrics_apart=listener is not None,
            )
        else:
            await serve_workers(compute, plan, on_ready=on_ready)
    finally:
        with anyio.CancelScope(shield=True):
            if before_close is not None:
                await before_close()
            if hosted is not None:
                await hosted.close()
            if internal is not None:
                await internal.close()
            if listener is not None:
                await listener.close()
            await close(compute)
