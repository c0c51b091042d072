"""The core object: ``better_compute(options)`` and what it returns."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

import anyio
import anyio.abc

from bettercompute._assembly import assemble, effective_max_in_flight, effective_max_queued
from bettercompute._options import Options
from bettercompute._runtime.context import Authz, Caches, DatabaseClock, ModuleContext, Settings
from bettercompute._runtime.declarations import Module
from bettercompute._runtime.dispatch import Dispatcher
from bettercompute._runtime.events import Events
from bettercompute._runtime.gateway_methods import GatewayMethod
from bettercompute._runtime.health import HealthCheck, HealthOutput
from bettercompute._runtime.http import HttpTransport, Request, Response
from bettercompute._runtime.jobs import Jobs
from bettercompute._runtime.metrics import Metrics
from bettercompute._runtime.registry import ApiBinding, ApiCall, GroupSpec, MethodDef, Registry
from bettercompute._runtime.workflows import Workflows
from bettercompute.errors import ComputeError, FailedPreconditionError, InvalidConfigError, NotFoundError
from bettercompute.modules.builtin import BuiltinGroups
from bettercompute.modules.nodes import GatewayServices, NodesModule
from bettercompute.ports import Iam, Store

__all__ = ["Api", "BetterCompute", "better_compute"]

G = TypeVar("G", bound=GroupSpec[Any])


class _ApiBinder:
    def __init__(self, registry: Registry, dispatcher: Dispatcher) -> None:
        self._registry = registry
        self._dispatcher = dispatcher

    async def call(
        self, method: MethodDef[Any, Any], credential: str | None, input: Any, *, idempotency_key: str | None = None
    ) -> Any:
        if self._registry.method(method.group, method.name) is not method:
            # As over HTTP, where the path of a group this control plane does not register is unknown.
            raise NotFoundError(f"no method {method.group}.{method.name}", details={"path": method.path})
        return await self._dispatcher.call(method, credential, input, idempotency_key=idempotency_key)


class Api(BuiltinGroups[ApiBinding]):
    """Every method as ``await api.<group>.<method>(credential, input)``, through the same dispatcher as HTTP.

    The built-in groups are typed attributes. A module's groups are typed through the module's own group set
    (``IamGroups(compute.api).tenants``, see ``bettercompute.GroupSet``); ``api.group(spec)`` binds any registered
    group class.
    """

    def __init__(self, registry: Registry, dispatcher: Dispatcher) -> None:
        self._registry = registry
        self._binder = _ApiBinder(registry, dispatcher)
        super().__init__(self)

    def binding(self) -> type[ApiBinding]:
        """``ApiBinding``: calls take a credential and an input."""
        return ApiBinding

    def binder(self) -> tuple[Any, type[Any]]:
        """The dispatcher's entry, and ``ApiCall``."""
        return self._binder, ApiCall

    def group(self, spec: type[G]) -> G:
        """A registered group class, bound to this api (for groups no group set names)."""
        if self._registry.group(spec.name) is not spec:
            raise AttributeError(f"group {spec.name!r} is not registered")
        return spec(self._binder, ApiCall)


def _default_instance() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class BetterCompute:
    """One control plane. Made by ``better_compute(options)``; see the members' docstrings."""

    def __init__(self, options: Options, modules: Sequence[Module], registry: Registry) -> None:
        self.options = options
        self.registry = registry
        self.endpoint = options.endpoint
        self.max_body_bytes = options.max_body_bytes
        """Request bodies above it are refused with 413 (``Options.max_body_bytes``)."""
        self.max_in_flight = effective_max_in_flight(options)
        """Requests the HTTP handler serves at once: ``Options.max_in_flight``, or its default for the store's pool."""
        self.max_queued = effective_max_queued(options)
        """Requests that may wait for a slot; more are shed with 503 (``Options.max_queued``, or ``max_in_flight``)."""
        self._modules = list(modules)
        assert options.store is not None and options.iam is not None, "checked by better_compute()"
        self._store: Store = options.store
        self._iam: Iam = options.iam
        self._clock = options.clock or DatabaseClock()
        self.events = Events()
        self.caches = Caches()
        self.authz = Authz(self._iam)
        self.metrics = Metrics()
        """This control plane's Prometheus metrics, in a registry of their own (``metrics.registry``); the HTTP
        handler serves them at ``GET /metrics``, ``metrics.render()`` gives the exposition text."""
        pool_stats = getattr(self._store, "pool_stats", None)
        if callable(pool_stats):
            self.metrics.watch_pool(pool_stats)
        self.context = ModuleContext(
            store=self._store,
            iam=self._iam,
            clock=self._clock,
            registry=registry,
            events=self.events,
            caches=self.caches,
            notifier=options.notifier,
            instance=options.instance or _default_instance(),
            module_versions=tuple((m.name, m.version) for m in self._modules),
            self_check=self.self_check,
            kms=options.kms,
            lease_ttl=options.lease_ttl,
            poll_interval=options.poll_interval,
            session_timeout=options.session_timeout,
            settings=Settings(s for s in (options.webhooks, options.join, options.capacity) if s is not None),
            metrics=self.metrics,
            sealed=tuple(key for m in self._modules for key in getattr(m, "sealed", ())),
        )
        unavailable = {
            group.name: reason
            for module in self._modules
            if (reason := getattr(module, "unavailable", None)) is not None
            for group in module.groups
        }
        self._dispatcher = Dispatcher(
            iam=self._iam, context=self.context, plugins=options.plugins, unavailable=unavailable
        )
        self.api = Api(registry, self._dispatcher)
        self.workflows = Workflows(self.context, [w for m in self._modules for w in getattr(m, "workflows", ())])
        """Start, inspect, signal and cancel workflows (the types modules declare in ``workflows``)."""
        _gateway_methods(self._modules)
        reconcilers = [r for m in self._modules for r in getattr(m, "reconcilers", ())]
        if self.workflows.types:
            reconcilers.append(self.workflows.reconciler)
        self.jobs = Jobs(
            [job for m in self._modules for job in m.jobs],
            self.context,
            reconcilers,
            injected_clock=options.clock is not None,
        )
        self._http = HttpTransport(self, self._dispatcher)
        self._initialized = False
        self._started = False
        self._lock = anyio.Lock()

    # --- transports ---------------------------------------------------------------------------------------------

    async def handler(self, request: Request) -> Response:
        """The transport-neutral HTTP handler: ``POST {endpoint}/{group}/{method}`` and the health endpoints."""
        return await self._http.handle(request)

    @property
    def asgi(self) -> Any:
        """The ASGI application; its lifespan runs ``initialize()`` at startup and ``close()`` at shutdown."""
        return self._http.app

    @property
    def gateway_services(self) -> GatewayServices:
        """JoinService's ``join``, ``renew_challenge`` and ``renew`` and the secret broker's ``secret``, for
        ``create_gateway``: set ``Options.join`` and ``Options.kms``, and call ``initialize()`` first.

        Raises:
            FailedPreconditionError: ``Options.join`` or ``Options.kms`` is not set, or ``initialize()`` has not run.
        """
        for module in self._modules:
            if isinstance(module, NodesModule):
                return module.services
        raise FailedPreconditionError("the nodes module is not registered")  # pragma: no cover - it always is

    # --- lifecycle ----------------------------------------------------------------------------------------------

    def catalog(self) -> set[str]:
        """The merged action catalog: every registered method's action (derived from its declaration), and the
        actions modules and plugins check outside a method (``Module.actions``, ``Plugin.actions``)."""
        actions: set[str] = self.registry.actions()
        for module in self._modules:
            actions.update(module.actions)
        for plugin in self.options.plugins:
            actions.update(plugin.actions)
        return actions

    async def initialize(self, *, migrate: bool = True) -> None:
        """Run migrations, anchor the clock, start the modules.

        Idempotent. ``migrate=False`` skips the migrations (``serve --no-migrate``). Every method's action is in the
        catalog by construction (``catalog()`` is derived from the declarations), so there is nothing to check there.

        Raises:
            InvalidConfigError: a migration is malformed, or a module cannot start with what is stored (a key that
                does not open with the configured KMS).
            UnavailableError: the database cannot be reached.
        """
        async with self._lock:
            if self._initialized:
                return
            store = self._store
            await store.open()
            if migrate:
                await self.migrate()
            started = time.time()
            t0 = time.monotonic()
            database_now = await store.now()
            if isinstance(self._clock, DatabaseClock):
                self._clock.anchor(database_now, measured_at=started, round_trip=time.monotonic() - t0)
            for module in self._modules:
                await module.start(self.context)
            self._initialized = True

    async def migrate(self) -> dict[str, list[int]]:
        """Apply the store's and every module's pending migrations; returns the versions applied, per name they are
        recorded under (``"runtime"`` for the store's own tables, then each module's name)."""
        store = self._store
        await store.open()
        applied = {"runtime": await store.install()}
        # In the modules' order, which is fixed (the built-in ones first): a module's tables may refer to an earlier
        # one's (``nodes`` to ``pools``).
        for module in self._modules:
            steps = [*store.migrations(module.name), *module.migrations.get(store.dialect, ())]
            if steps:
                applied[module.name] = await store.migrate(module.name, steps)
        return applied

    async def start(self, roles: Collection[str]) -> None:
        """Run the worker roles (``controllers``, ``scheduler``, ``sinks``, ``iam``) in the background.

        Calls ``initialize()`` first when it has not run.
        """
        await self.initialize()
        await self.jobs.start(roles)
        self._started = True

    async def run(
        self, roles: Collection[str], *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The structured form of ``start``: run the worker roles until cancelled (``await tg.start(compute.run,
        roles)``), then hand their leases back."""
        await self.initialize()
        await self.jobs.run(roles, task_status=task_status)

    async def stop(self) -> None:
        """Stop the worker roles started by ``start()`` (from any task), handing their leases back, and stop the
        modules."""
        await self.jobs.stop()
        if self._initialized:
            for module in reversed(self._modules):
                await module.stop()
        self._started = False

    async def close(self) -> None:
        """``stop()``, then close the store's connections. ``initialize()`` may be called again after it."""
        await self.stop()
        await self._store.close()
        self._initialized = False

    async def self_check(self) -> HealthOutput:
        """Read-only checks: can the database be reached, has ``initialize()`` run."""
        checks = []
        try:
            with anyio.fail_after(2):
                await self._store.ping()
            checks.append(HealthCheck(name="database", ok=True, detail="reachable"))
        except (ComputeError, TimeoutError):
            checks.append(HealthCheck(name="database", ok=False, detail="unreachable"))
        checks.append(
            HealthCheck(
                name="initialized",
                ok=self._initialized,
                detail="initialize() has run" if self._initialized else "initialize() has not run",
            )
        )
        ok = all(c.ok for c in checks)
        return HealthOutput(status="ok" if ok else "unavailable", checks=tuple(checks))

    @property
    def initialized(self) -> bool:
        """Whether ``initialize()`` has completed."""
        return self._initialized


def better_compute(options: Options) -> BetterCompute:
    """Build a control plane. Synchronous and without I/O: nothing touches the database or IAM until you call it.

    Registers the core's groups, IAM's (when it is a module), then ``options.modules``, then ``options.plugins``.

    Raises:
        InvalidConfigError: listing every problem found in ``details["problems"]``.
    """
    if not isinstance(options, Options):
        raise InvalidConfigError("better_compute() takes an Options", details={"problems": ["not an Options"]})
    problems, modules, registry = assemble(options)
    if problems:
        raise InvalidConfigError(
            f"the options have {len(problems)} problem(s): " + "; ".join(problems), details={"problems": problems}
        )
    return BetterCompute(options, modules, registry)


def _gateway_methods(modules: Sequence[Any]) -> None:
    """Hand every module's gateway methods (``gateway_methods``) to the identity module, which answers them.

    Raises:
        InvalidConfigError: a method is declared twice or is not a ``GatewayMethod``, or there are methods but no
            identity module (``Options.join`` and ``Options.kms``).
    """
    problems: list[str] = []
    methods: dict[str, GatewayMethod] = {}
    for module in modules:
        for declared in getattr(module, "gateway_methods", ()) if not isinstance(module, NodesModule) else ():
            if not isinstance(declared, GatewayMethod):
                problems.append(f"{module.name}: {type(declared).__name__} is not a bettercompute.GatewayMethod")
            elif declared.name in methods:
                problems.append(f"gateway method {declared.name!r} is declared twice")
            else:
                methods[declared.name] = declared
    identity = next((m for m in modules if isinstance(m, NodesModule) and m.identity), None)
    if methods and identity is None:
        problems.append("gateway methods need node identity: set Options.join and Options.kms")
    if problems:
        raise InvalidConfigError("the gateway methods are misdeclared", details={"problems": problems})
    if identity is not None:
        identity.gateway_methods = tuple(methods.values())
    _tunnel_checks(modules, identity)


def _tunnel_checks(modules: Sequence[Any], identity: NodesModule | None) -> None:
    """Hand every module's tunnel checks (``tunnel_checks``: resource type -> ``TunnelCheck``) to the identity
    module, whose gateway services run them for the open tunnels to resources of those types.

    Raises:
        InvalidConfigError: a resource type is checked by two modules, a check is not callable, or there are checks
            but no identity module.
    """
    problems: list[str] = []
    checks: dict[str, Any] = {}
    for module in modules:
        if isinstance(module, NodesModule):
            continue
        for resource_type, check in dict(getattr(module, "tunnel_checks", {})).items():
            if not callable(check):
                problems.append(f"{module.name}: the tunnel check of {resource_type!r} is not callable")
            elif resource_type in checks or (identity is not None and resource_type in identity.tunnel_checks):
                problems.append(f"the tunnels to {resource_type!r} are checked by two modules")
            else:
                checks[resource_type] = check
    if checks and identity is None:
        problems.append("tunnel checks need node identity: set Options.join and Options.kms")
    if problems:
        raise InvalidConfigError("the tunnel checks are misdeclared", details={"problems": problems})
    if identity is not None:
        identity.tunnel_checks.update(checks)
