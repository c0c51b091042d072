"""The core object: ``better_compute(options)`` and what it returns."""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

import anyio
import anyio.abc
import attrs

from ._dispatch import Dispatcher
from ._http import HttpTransport, Request, Response
from ._jobs import BUILTIN_JOBS, ROLES, Events, Job, Jobs
from ._options import Module, Options, Plugin, duration_problem, is_int, settings_problems, version_in_range
from ._registry import ApiBinding, ApiCall, GroupSpec, Registry
from ._version import __version__
from ._workflows import Workflows
from .commands import COMMAND_SWEEPER
from .errors import ComputeError, FailedPreconditionError, InvalidConfigError
from .identity import Attestor, GatewayServices, IdentityModule
from .joins import JoinSettings
from .modules.pools import PoolsModule
from .modules.secrets import SecretsModule
from .modules.system import ACTIONS as SYSTEM_ACTIONS
from .modules.system import HealthCheck, HealthOutput, SystemGroup
from .modules.webhooks import WebhooksModule
from .ports import Clock, Decision, Iam, Identity, Notifier, ResourceRef, Store
from .usage import USAGE
from .webhooks import WebhookSettings

__all__ = ["Api", "BetterCompute", "Caches", "DatabaseClock", "ModuleContext", "better_compute"]

_ENDPOINT = re.compile(r"^(/[a-z0-9][a-z0-9._-]*)+$")
_STORE_MEMBERS = (
    "open",
    "close",
    "ping",
    "now",
    "migrate",
    "transaction",
    "leases",
    "queue",
    "outbox",
    "idempotency",
    "commands",
    "sessions",
    "bookings",
    "usage",
)
_IAM_MEMBERS = ("authenticate", "require")


class DatabaseClock:
    """The process clock, shifted by the offset to the database's clock measured at ``initialize()``."""

    def __init__(self) -> None:
        self._offset = dt.timedelta(0)

    def anchor(self, database_now: dt.datetime, *, measured_at: float, round_trip: float) -> None:
        """Record the database's time as read ``round_trip`` seconds around ``measured_at`` (``time.time()``)."""
        local = dt.datetime.fromtimestamp(measured_at + round_trip / 2, dt.UTC)
        self._offset = database_now - local

    @property
    def offset(self) -> dt.timedelta:
        """How far the database's clock is ahead of this process's."""
        return self._offset

    def now(self) -> dt.datetime:
        """Timezone-aware UTC now, on the database's clock."""
        return dt.datetime.now(dt.UTC) + self._offset


class Caches:
    """Named in-process caches, so that a change (a revoked credential) clears what depends on it at once."""

    def __init__(self) -> None:
        self._caches: dict[str, Callable[[str | None], None]] = {}

    def register(self, name: str, invalidate: Callable[[str | None], None]) -> None:
        """Register a cache; ``invalidate(key)`` drops one entry, ``invalidate(None)`` all of them."""
        self._caches[name] = invalidate

    def invalidate(self, name: str, key: str | None = None) -> None:
        """Drop ``key`` (or everything) from the named cache; unknown names are ignored."""
        invalidate = self._caches.get(name)
        if invalidate is not None:
            invalidate(key)

    def invalidate_all(self) -> None:
        """Drop every entry of every cache."""
        for invalidate in self._caches.values():
            invalidate(None)

    @property
    def names(self) -> list[str]:
        """The registered caches."""
        return sorted(self._caches)


@attrs.frozen(kw_only=True)
class ModuleContext:
    """What modules, handlers and jobs get: the parts of this control plane."""

    options: Options
    store: Store
    iam: Iam
    clock: Clock
    registry: Registry
    events: Events
    caches: Caches
    notifier: Notifier | None
    instance: str
    module_versions: tuple[tuple[str, str], ...]
    self_check: Callable[[], Awaitable[HealthOutput]]


class Authz:
    """Authorization decisions outside a method call (the projection arrives with the IAM module)."""

    def __init__(self, iam: Iam) -> None:
        self._iam = iam

    async def require(self, identity: Identity, action: str, resource: ResourceRef) -> Decision:
        """Allow, returning the decision, or raise ``AccessDeniedError``."""
        return await self._iam.require(identity, action, resource)


class _ApiBinder:
    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher

    async def call(self, method: Any, credential: str | None, input: Any) -> Any:
        return await self._dispatcher.call(method, credential, input)


class Api:
    """Every method as ``await api.<group>.<method>(credential, input)``, through the same dispatcher as HTTP.

    The core's groups are typed attributes; a module's group is reached by its attribute name too
    (``api.join_tokens``), or typed with ``api.group(JoinTokensGroup)``.
    """

    def __init__(self, registry: Registry, dispatcher: Dispatcher) -> None:
        self._registry = registry
        self._binder = _ApiBinder(dispatcher)
        self.system = SystemGroup[ApiBinding](self._binder, ApiCall)

    def group(self, spec: type[GroupSpec[Any]]) -> Any:
        """A registered group, bound to this api (annotate the result as ``MyGroup[ApiBinding]``)."""
        if self._registry.group(spec.name) is not spec:
            raise AttributeError(f"group {spec.name!r} is not registered")
        return spec(self._binder, ApiCall)

    def __getattr__(self, attr: str) -> Any:
        spec = self._registry.group_by_attr(attr)
        if spec is None:
            raise AttributeError(f"no group {attr!r} is registered")
        return spec(self._binder, ApiCall)


@attrs.frozen(kw_only=True)
class _CoreModule:
    """The built-in groups of the core, registered first."""

    name: str = "core"
    version: str = __version__
    core_range: str = f"=={__version__}"
    groups: Sequence[type[GroupSpec[Any]]] = (SystemGroup,)
    actions: Sequence[str] = SYSTEM_ACTIONS
    migrations: Any = attrs.field(factory=dict)
    jobs: Sequence[Job] = (*BUILTIN_JOBS, COMMAND_SWEEPER, USAGE)

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None


def _default_instance() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class BetterCompute:
    """One control plane. Made by ``better_compute(options)``; see the members' docstrings."""

    def __init__(self, options: Options, modules: Sequence[Module], registry: Registry) -> None:
        self.options = options
        self.registry = registry
        self.endpoint = options.endpoint
        self.max_in_flight = effective_max_in_flight(options)
        """Requests the HTTP handler serves at once: ``Options.max_in_flight``, or its default for the store's pool."""
        self._modules = list(modules)
        assert options.store is not None and options.iam is not None, "checked by better_compute()"
        self._store: Store = options.store
        self._iam: Iam = options.iam
        self._clock = options.clock or DatabaseClock()
        self.events = Events()
        self.caches = Caches()
        self.authz = Authz(self._iam)
        self.context = ModuleContext(
            options=options,
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
        )
        self._dispatcher = Dispatcher(iam=self._iam, context=self.context, plugins=options.plugins)
        self.api = Api(registry, self._dispatcher)
        self.workflows = Workflows(self.context, [w for m in self._modules for w in getattr(m, "workflows", ())])
        """Start, inspect, signal and cancel workflows (the types modules declare in ``workflows``)."""
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
        return self._http.asgi

    @property
    def gateway_services(self) -> GatewayServices:
        """JoinService's ``join``, ``renew_challenge`` and ``renew`` and the secret broker's ``secret``, for
        ``create_gateway``: set ``Options.join`` and ``Options.kms``, and call ``initialize()`` first.

        Raises:
            FailedPreconditionError: ``Options.join`` or ``Options.kms`` is not set, or ``initialize()`` has not run.
        """
        for module in self._modules:
            if isinstance(module, IdentityModule):
                return module.services
        raise FailedPreconditionError("gateway services need Options.join and Options.kms")

    # --- lifecycle ----------------------------------------------------------------------------------------------

    def catalog(self) -> set[str]:
        """The merged action catalog: the core's, every module's and plugin's, and IAM's own."""
        actions: set[str] = set()
        for module in self._modules:
            actions.update(module.actions)
        for plugin in self.options.plugins:
            actions.update(plugin.actions)
        return actions

    async def initialize(self, *, migrate: bool = True) -> None:
        """Check every method's action against the catalog, run migrations, anchor the clock, start the modules.

        Idempotent. ``migrate=False`` skips the migrations (``serve --no-migrate``).

        Raises:
            InvalidConfigError: a method's action is missing from the catalog, or a migration is malformed.
            UnavailableError: the database cannot be reached.
        """
        async with self._lock:
            if self._initialized:
                return
            catalog = self.catalog()
            missing = sorted(
                f"{m.group}.{m.name}: {m.action}" for m in self.registry.methods() if m.action not in catalog
            )
            if missing:
                raise InvalidConfigError(
                    "some methods use actions missing from the action catalog", details={"problems": missing}
                )
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
        """Apply the store's and every module's pending migrations; returns the versions applied, per module."""
        store = self._store
        await store.open()
        applied = {"store": await store.install()}
        for module in self._modules:
            steps = module.migrations.get(store.dialect, ())
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


def _problems_of(options: Options) -> tuple[list[str], list[Module], Registry]:
    problems: list[str] = []
    # Typed as required, but a host may still pass None or a wrong object: check what is really there.
    store: Any = options.store
    iam: Any = options.iam
    if store is None:
        problems.append("store: a store is required (bettercompute_store_pg.PgStore)")
    else:
        missing = [m for m in (*_STORE_MEMBERS, "install", "dialect") if not hasattr(store, m)]
        if missing:
            problems.append(f"store: {type(store).__name__} lacks {', '.join(missing)}")
    if iam is None:
        problems.append("iam: an IAM is required (bettercompute_iam.EmbeddedIam)")
    else:
        missing = [m for m in _IAM_MEMBERS if not hasattr(iam, m)]
        if missing:
            problems.append(f"iam: {type(iam).__name__} lacks {', '.join(missing)}")
    problems.extend(_scalar_problems(options))
    problems.extend(_pool_problems(store, options.max_in_flight))
    kms: Any = options.kms
    if kms is not None:
        missing = [m for m in ("encrypt", "decrypt") if not hasattr(kms, m)]
        if missing:
            problems.append(f"kms: {type(kms).__name__} lacks {', '.join(missing)}")
        if store is not None and not hasattr(store, "webhooks"):
            problems.append(f"store: {type(store).__name__} lacks webhooks (needed by the webhooks module)")
        if store is not None and not hasattr(store, "secrets"):
            problems.append(f"store: {type(store).__name__} lacks secrets (needed by the secrets module)")
    webhooks: Any = options.webhooks
    if not isinstance(webhooks, WebhookSettings):
        problems.append(f"webhooks: must be a bettercompute.webhooks.WebhookSettings, not {type(webhooks).__name__}")
    else:
        # Values are compared only once their types are right; a wrong setting is wrong with or without a KMS.
        problems.extend(settings_problems("webhooks", webhooks) or webhooks.problems())

    if store is not None:
        missing = [m for m in ("pools", "join_tokens") if not hasattr(store, m)]
        if missing:
            problems.append(f"store: {type(store).__name__} lacks {', '.join(missing)} (needed by the pools module)")
    join: Any = options.join
    if join is not None and not isinstance(join, JoinSettings):
        problems.append(f"join: must be a bettercompute.joins.JoinSettings or None, not {type(join).__name__}")
        join = None
    if join is not None:
        problems.extend(settings_problems("join", join) or join.problems())
        missing = [m for m in ("nodes", "join_keys", "certificates", "nonces") if not hasattr(store, m)]
        if store is not None and missing:
            problems.append(f"store: {type(store).__name__} lacks {', '.join(missing)} (needed by JoinService)")
    attestors: Sequence[Any] = _sequence("attestors", options.attestors, problems)
    for index, attestor in enumerate(attestors):
        if not isinstance(attestor, Attestor):
            problems.append(f"attestors[{index}]: {type(attestor).__name__} is not an attestor (name and attest())")
    if attestors and (join is None or kms is None):
        problems.append("attestors: JoinService runs only with Options.join and Options.kms")

    modules: list[Module] = [_CoreModule(), PoolsModule()]
    # Webhooks keep their signing secrets sealed by the KMS: the group exists only where one is configured.
    if kms is not None:
        modules.append(WebhooksModule())
        modules.append(SecretsModule())
        if join is not None:
            modules.append(IdentityModule(join, kms, attestors))
    extra: list[Any] = []
    if iam is not None and isinstance(iam, Module):
        extra.append(iam)
    given = _sequence("modules", options.modules, problems)
    extra.extend(given)
    names = {"core", "pools", "webhooks", "secrets", "identity"}
    for position, module in enumerate(extra):
        # The IAM, when it is a module, comes first but is not one of options.modules.
        index = position - (len(extra) - len(given))
        where = f"modules[{index}]" if index >= 0 else "iam"
        if not isinstance(module, Module):
            problems.append(f"{where}: {type(module).__name__} is not a module (see bettercompute.Module)")
            continue
        declared = _declaration_problems(where, module, module=True)
        if declared:
            problems.extend(declared)
            continue
        if module.name in names:
            problems.append(f"{where}: the name {module.name!r} is used twice")
            continue
        problems.extend(_range_problems(f"module {module.name!r}", module.core_range))
        if "kms" in getattr(module, "requires", ()) and kms is None:
            problems.append(
                f"kms: module {module.name!r} keeps secrets at rest and needs Options.kms"
                " (bettercompute.LocalKeyKms(path), the same key file in every process)"
            )
        names.add(module.name)
        modules.append(module)
    plugin_names: set[str] = set()
    plugins: Sequence[Any] = _sequence("plugins", options.plugins, problems)
    for index, plugin in enumerate(plugins):
        if not isinstance(plugin, Plugin):
            problems.append(f"plugins[{index}]: {type(plugin).__name__} is not a plugin (see bettercompute.Plugin)")
            continue
        declared = _declaration_problems(f"plugins[{index}]", plugin, module=False)
        if declared:
            problems.extend(declared)
            continue
        if plugin.name in plugin_names:
            problems.append(f"plugins[{index}]: the name {plugin.name!r} is used twice")
        plugin_names.add(plugin.name)
        problems.extend(_range_problems(f"plugin {plugin.name!r}", plugin.core_range))

    lease_names: set[str] = set()
    for module in modules:
        for job in module.jobs:
            # Jobs() would refuse it too, but alone: here it joins the list of every problem.
            if job.lease_name in lease_names:
                problems.append(f"modules: module {module.name!r} registers job {job.lease_name!r} a second time")
            lease_names.add(job.lease_name)
    registry = Registry()
    for module in modules:
        for spec in module.groups:
            problems.extend(registry.add(spec, owner=module.name))
    return problems, modules, registry


_MAX_BODY_LIMIT = 1024**3
_MAX_IN_FLIGHT_LIMIT = 10_000
_INSTANCE_LENGTH = 200


def _scalar_problems(options: Options) -> list[str]:
    """Type and range problems of the plain options (the settings objects are checked by their own classes)."""
    problems: list[str] = []
    endpoint: Any = options.endpoint
    if not isinstance(endpoint, str) or not _ENDPOINT.match(endpoint):
        # Quoted (repr escapes control and bidi characters), and cut short: a message is no place for a megabyte.
        shown = repr(endpoint[:64]) if isinstance(endpoint, str) else f"a {type(endpoint).__name__}"
        problems.append(f"endpoint: {shown} must be a path like '/api/compute', without a trailing slash")
    body: Any = options.max_body_bytes
    if not is_int(body) or not 1024 <= body <= _MAX_BODY_LIMIT:
        problems.append("max_body_bytes: must be an integer between 1024 and 1 GiB")
    in_flight: Any = options.max_in_flight
    if in_flight is not None and (not is_int(in_flight) or not 1 <= in_flight <= _MAX_IN_FLIGHT_LIMIT):
        problems.append(f"max_in_flight: must be a positive integer (at most {_MAX_IN_FLIGHT_LIMIT}) or None")
    instance: Any = options.instance
    # It names this process in lease and worker rows: text PostgreSQL can store and a person can read in a log.
    if instance is not None and (
        not isinstance(instance, str) or not 0 < len(instance) <= _INSTANCE_LENGTH or not instance.isprintable()
    ):
        problems.append(f"instance: must be printable text of 1 to {_INSTANCE_LENGTH} characters, or None")
    second, day = dt.timedelta(seconds=1), dt.timedelta(days=1)
    for problem in (
        duration_problem("lease_ttl", options.lease_ttl, at_least=second, at_most=day),
        # Shorter than a millisecond, an idle loop would spin instead of sleeping.
        duration_problem("poll_interval", options.poll_interval, at_least=dt.timedelta(milliseconds=1), at_most=day),
        duration_problem("session_timeout", options.session_timeout, at_least=second, at_most=day),
    ):
        if problem is not None:
            problems.append(problem)
    notifier: Any = options.notifier
    if notifier is not None:
        missing = [m for m in ("notify", "listen") if not callable(getattr(notifier, m, None))]
        if missing:
            problems.append(f"notifier: {type(notifier).__name__} lacks {', '.join(missing)}")
    clock: Any = options.clock
    if clock is not None and not callable(getattr(clock, "now", None)):
        problems.append(f"clock: {type(clock).__name__} lacks now()")
    return problems


# A singleton job's pass holds a connection while the lease beside it is renewed on another: one process running
# any worker role needs two at once, whatever else it does.
_WORKER_CONNECTIONS = 2
# Requests never take the whole pool: this many connections stay for the worker loops of the same process (their
# lease renewals and membership heartbeats must not wait behind a burst of requests until the leases lapse).
_WORKER_RESERVE = 1


def _pool_problems(store: Any, max_in_flight: Any) -> list[str]:
    """Whether the store's pool can serve ``max_in_flight`` requests and the worker loops beside them.

    Each request in flight holds at most one pooled connection, and ``_WORKER_RESERVE`` connections stay for the
    worker roles. A cap above that would make the pool the queue, with its timeout: a burst would fail with
    ``UNAVAILABLE`` instead of waiting its turn, and worker loops would wait behind it.
    """
    capacity = getattr(store, "pool_capacity", None) if store is not None else None
    if capacity is None:
        return []
    if not is_int(capacity) or capacity < 1:
        return [f"store: pool_capacity must be a positive integer, not {capacity!r}"[:200]]
    problems = []
    if capacity < _WORKER_CONNECTIONS:
        problems.append(
            f"store: a pool of {capacity} connection cannot run a job pass beside its lease renewal; "
            f"give it at least {_WORKER_CONNECTIONS} (PgStore(pool_size=...))"
        )
    if is_int(max_in_flight) and max_in_flight > capacity - _WORKER_RESERVE:
        problems.append(
            f"max_in_flight: {max_in_flight} requests at once need {max_in_flight} pooled connections and the "
            f"worker roles {_WORKER_RESERVE} more, but the store's pool holds {capacity}: lower max_in_flight to "
            f"{max(1, capacity - _WORKER_RESERVE)} or raise the pool size to {max_in_flight + _WORKER_RESERVE}"
        )
    return problems


_DEFAULT_IN_FLIGHT = 16


def effective_max_in_flight(options: Options) -> int:
    """``Options.max_in_flight``, or by default 16, or fewer when the store's pool must also serve the workers."""
    if options.max_in_flight is not None:
        return options.max_in_flight
    capacity: Any = getattr(options.store, "pool_capacity", None)
    if is_int(capacity) and capacity >= 1:
        return max(1, min(_DEFAULT_IN_FLIGHT, capacity - _WORKER_RESERVE))
    return _DEFAULT_IN_FLIGHT


def _sequence(name: str, value: Any, problems: list[str]) -> Sequence[Any]:
    """``value`` when it is a list or tuple; otherwise a problem and nothing (a str is a sequence of letters)."""
    if isinstance(value, list | tuple):
        return value
    problems.append(f"{name}: must be a list or tuple, not {type(value).__name__}")
    return ()


def _declaration_problems(where: str, part: Any, *, module: bool) -> list[str]:
    """What is malformed in a module's or plugin's declared members (the protocol check only sees that they
    exist)."""
    problems: list[str] = []
    texts = ("name", "version", "core_range") if module else ("name", "core_range")
    for attr in texts:
        value = getattr(part, attr)
        # Names land in tables (schema_migrations, leases) and in logs: no NUL, no control characters.
        if not isinstance(value, str) or not value or not value.isprintable():
            problems.append(f"{where}: {attr} must be non-empty printable text")
    actions = part.actions
    if not isinstance(actions, list | tuple | set | frozenset) or not all(isinstance(a, str) for a in actions):
        problems.append(f"{where}: actions must be a list of action names")
    if not callable(getattr(part, "intercept" if not module else "start", None)):
        problems.append(f"{where}: {'intercept' if not module else 'start'} must be a method")
    if not module:
        return problems
    groups = part.groups
    if not isinstance(groups, list | tuple) or not all(
        isinstance(g, type) and issubclass(g, GroupSpec) for g in groups
    ):
        problems.append(f"{where}: groups must be a list of GroupSpec classes")
    if not isinstance(part.migrations, Mapping):
        problems.append(f"{where}: migrations must be a mapping of dialect to migrations")
    # Optional members, read with getattr() where the control plane is built: absent, or a list (whose items Jobs
    # and Workflows check, raising INVALID_CONFIG themselves).
    for attr in ("reconcilers", "workflows"):
        if not isinstance(getattr(part, attr, ()), list | tuple):
            problems.append(f"{where}: {attr} must be a list")
    jobs = part.jobs
    if not isinstance(jobs, list | tuple):
        problems.append(f"{where}: jobs must be a list of bettercompute.Job")
    else:
        for index, job in enumerate(jobs):
            if not isinstance(job, Job):
                problems.append(f"{where}: jobs[{index}] is a {type(job).__name__}, not a bettercompute.Job")
                continue
            typed = settings_problems(f"{where}: jobs[{index}]", job)
            problems.extend(typed)
            run: Any = job.run  # typed as a function, but a module may declare anything
            if not callable(run):
                problems.append(f"{where}: jobs[{index}].run must be an async function")
            if not typed and job.role not in ROLES:
                problems.append(f"{where}: jobs[{index}] has an unknown role {job.role!r}")
            if not typed and not (0 < len(job.name) <= _INSTANCE_LENGTH and job.name.isprintable()):
                # It names the job's lease row: text PostgreSQL can store (no NUL) and a log can show.
                problems.append(
                    f"{where}: jobs[{index}].name must be printable text of 1 to {_INSTANCE_LENGTH} characters"
                )
    return problems


def _range_problems(what: str, core_range: str) -> list[str]:
    try:
        if not version_in_range(__version__, core_range):
            return [f"{what} supports core {core_range}, but this core is {__version__}"]
    except ValueError as exc:
        return [f"{what}: {exc}"]
    return []


def better_compute(options: Options) -> BetterCompute:
    """Build a control plane. Synchronous and without I/O: nothing touches the database or IAM until you call it.

    Registers the core's groups, IAM's (when it is a module), then ``options.modules``, then ``options.plugins``.

    Raises:
        InvalidConfigError: listing every problem found in ``details["problems"]``.
    """
    if not isinstance(options, Options):
        raise InvalidConfigError("better_compute() takes an Options", details={"problems": ["not an Options"]})
    problems, modules, registry = _problems_of(options)
    if problems:
        raise InvalidConfigError(
            f"the options have {len(problems)} problem(s): " + "; ".join(problems), details={"problems": problems}
        )
    return BetterCompute(options, modules, registry)
