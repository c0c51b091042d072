"""How ``better_compute()`` checks its options and assembles the modules: every problem is collected, none raised,
so that one ``INVALID_CONFIG`` lists them all."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bettercompute._options import Options
from bettercompute._runtime.declarations import (
    Module,
    Plugin,
    duration_problem,
    is_int,
    settings_problems,
    version_in_range,
)
from bettercompute._runtime.jobs import BUILTIN_JOBS, ROLES, Job
from bettercompute._runtime.registry import GroupSpec, Registry
from bettercompute._version import __version__
from bettercompute.errors import ComputeError
from bettercompute.modules.audit import AuditModule
from bettercompute.modules.capacity import CapacityModule
from bettercompute.modules.commands import CommandsModule
from bettercompute.modules.images import ImagesModule
from bettercompute.modules.inventory import AcceptanceCheck, InventoryModule
from bettercompute.modules.nodes import Attestor, JoinSettings, NodesModule
from bettercompute.modules.pools import PoolsModule
from bettercompute.modules.reservations import ReservationsModule
from bettercompute.modules.secrets import SecretBroker, SecretsModule
from bettercompute.modules.system import SystemModule
from bettercompute.modules.usage import UsageModule
from bettercompute.modules.webhooks import WebhookSettings, WebhooksModule

__all__ = ["assemble", "effective_max_in_flight", "effective_max_queued"]

_ENDPOINT = re.compile(r"^(/[a-z0-9][a-z0-9._-]*)+$")
_STORE_MEMBERS = (
    "open",
    "close",
    "ping",
    "now",
    "migrate",
    "migrations",
    "transaction",
    "leases",
    "queue",
    "outbox",
    "idempotency",
    "repository",
)
_IAM_MEMBERS = ("authenticate", "require")


def assemble(options: Options) -> tuple[list[str], list[Module], Registry]:
    """Every problem of ``options`` at once, the modules they make and the registry of their groups."""
    problems: list[str] = []
    attestors = part_problems(options, problems)
    modules = modules_of(options, attestors, problems)
    problems.extend(repository_problems(options.store, modules))
    problems.extend(job_problems(modules))
    registry = registry_of(modules, problems)
    return problems, modules, registry


def part_problems(options: Options, problems: list[str]) -> Sequence[Any]:
    """Check the store, the IAM, the KMS, the plain options and the built-in modules' settings; returns the attestors
    (checked here, used by ``modules_of``)."""
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
    webhooks: Any = options.webhooks
    if not isinstance(webhooks, WebhookSettings):
        problems.append(
            f"webhooks: must be a bettercompute.modules.webhooks.WebhookSettings, not {type(webhooks).__name__}"
        )
    else:
        # Values are compared only once their types are right; a wrong setting is wrong with or without a KMS.
        problems.extend(settings_problems("webhooks", webhooks) or webhooks.problems())

    join: Any = options.join
    if join is not None and not isinstance(join, JoinSettings):
        problems.append(f"join: must be a bettercompute.JoinSettings or None, not {type(join).__name__}")
        join = None
    if join is not None:
        problems.extend(settings_problems("join", join) or join.problems())
    attestors: Sequence[Any] = _sequence("attestors", options.attestors, problems)
    for index, attestor in enumerate(attestors):
        if not isinstance(attestor, Attestor):
            problems.append(f"attestors[{index}]: {type(attestor).__name__} is not an attestor (name and attest())")
    if attestors and (join is None or kms is None):
        problems.append("attestors: JoinService runs only with Options.join and Options.kms")
    return attestors


BUILTIN_NAMES = frozenset(
    {
        "core",
        "runtime",
        "pools",
        "images",
        "commands",
        "usage",
        "capacity",
        "reservations",
        "webhooks",
        "secrets",
        "nodes",
        "inventory",
        "audit",
    }
)
"""The names the built-in modules are registered and migrated under (``"core"`` is the system module's, ``"runtime"``
the store's own tables'): no other module may take one."""


def modules_of(options: Options, attestors: Sequence[Any], problems: list[str]) -> list[Module]:
    """The built-in modules, then the IAM (when it is a module) and ``options.modules``, each checked; the plugins
    are checked too."""
    extra = _extra_modules(options, problems)
    checks = _acceptance_checks(extra, problems)
    _plugin_problems(options, problems)
    return [*_builtin_modules(options, attestors, checks), *extra]


def _builtin_modules(options: Options, attestors: Sequence[Any], checks: Sequence[AcceptanceCheck]) -> list[Module]:
    """The core's own modules, always all of them, in the order their tables are made."""
    kms: Any = options.kms
    join: Any = options.join if isinstance(options.join, JoinSettings) else None
    # Node identity (JoinService, the CA, the gateway services) needs both settings; the groups are there anyway.
    broker = (lambda store: SecretBroker(store, kms)) if kms is not None else None
    return [
        SystemModule(jobs=BUILTIN_JOBS),
        PoolsModule(),
        # Before any module of options.modules: bare metal's and VPS's tables refer to the images table.
        ImagesModule(),
        CommandsModule(),
        UsageModule(),
        CapacityModule(),
        ReservationsModule(),
        # Webhooks and secrets keep what they hold sealed by the KMS: without one their groups say so.
        WebhooksModule(kms=kms is not None),
        SecretsModule(kms=kms is not None),
        NodesModule(join, kms, attestors, secret_broker=broker),
        # The built-in node controllers, with the acceptance checks other modules declare.
        InventoryModule(checks),
        # Reads the runtime's audit table, which every module writes; its migration makes that table append-only.
        AuditModule(),
    ]


def _extra_modules(options: Options, problems: list[str]) -> list[Module]:
    """The IAM (when it is a module) and ``options.modules``, those that pass their checks."""
    iam: Any = options.iam
    given = _sequence("modules", options.modules, problems)
    extra: list[Any] = [iam] if iam is not None and isinstance(iam, Module) else []
    extra.extend(given)
    names = set(BUILTIN_NAMES)
    accepted: list[Module] = []
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
        if "kms" in getattr(module, "requires", ()) and options.kms is None:
            problems.append(
                f"kms: module {module.name!r} keeps secrets at rest and needs Options.kms"
                " (bettercompute.LocalKeyKms(path), the same key file in every process)"
            )
        names.add(module.name)
        accepted.append(module)
    return accepted


def _acceptance_checks(modules: Sequence[Module], problems: list[str]) -> list[AcceptanceCheck]:
    """The acceptance checks ``modules`` declare (``acceptance_checks``), for the inventory's controllers."""
    checks = [c for m in modules for c in getattr(m, "acceptance_checks", ())]
    bad = [type(c).__name__ for c in checks if not isinstance(c, AcceptanceCheck)]
    if bad:
        problems.append(f"acceptance_checks: {bad[0]} is not a bettercompute.modules.inventory.AcceptanceCheck")
        return []
    return checks


def _plugin_problems(options: Options, problems: list[str]) -> None:
    """What is malformed in ``options.plugins``, added to ``problems``."""
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


def repository_problems(store: Any, modules: Sequence[Module]) -> list[str]:
    """The repositories a module needs (its optional ``repositories`` and ``sealed``, typed keys) that the store
    does not ship."""
    problems: list[str] = []
    if store is None or not callable(getattr(store, "repository", None)):
        return problems
    for module in modules:
        for key in (*getattr(module, "repositories", ()), *getattr(module, "sealed", ())):
            try:
                store.repository(key)
            except ComputeError:
                problems.append(
                    f"store: {type(store).__name__} has no repository {key.module}.{key.name}"
                    f" (needed by module {module.name!r})"
                )
    return problems


def job_problems(modules: Sequence[Module]) -> list[str]:
    """Jobs registered twice (by lease name) across the modules."""
    problems: list[str] = []
    lease_names: set[str] = set()
    for module in modules:
        for job in module.jobs:
            # Jobs() would refuse it too, but alone: here it joins the list of every problem.
            if job.lease_name in lease_names:
                problems.append(f"modules: module {module.name!r} registers job {job.lease_name!r} a second time")
            lease_names.add(job.lease_name)
    return problems


def registry_of(modules: Sequence[Module], problems: list[str]) -> Registry:
    """Every module's groups in one registry; a duplicate or malformed group is a problem."""
    registry = Registry()
    for module in modules:
        for spec in module.groups:
            problems.extend(registry.add(spec, owner=module.name))
    return registry


_MAX_BODY_LIMIT = 1024**3
_MAX_IN_FLIGHT_LIMIT = 10_000
_MAX_QUEUED_LIMIT = 100_000
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
    queued: Any = options.max_queued
    if queued is not None and (not is_int(queued) or not 0 <= queued <= _MAX_QUEUED_LIMIT):
        problems.append(f"max_queued: must be an integer from 0 to {_MAX_QUEUED_LIMIT:,}, or None (as max_in_flight)")
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


def effective_max_queued(options: Options) -> int:
    """``Options.max_queued``, or by default as many as ``effective_max_in_flight``: a full queue then waits about one
    service time (see ``bettercompute._runtime.shedding``)."""
    if options.max_queued is not None:
        return options.max_queued
    return effective_max_in_flight(options)


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
