"""The protocols of what a host plugs in (modules and plugins), and the checks their declarations go through."""

from __future__ import annotations

import datetime as dt
import re
import sys
import types
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

import attrs

from bettercompute.ports import Migration, Repository

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute._runtime.jobs import Job
    from bettercompute._runtime.registry import CallContext, GroupSpec

__all__ = [
    "Intercepted",
    "Module",
    "Next",
    "Plugin",
    "StaticModule",
    "duration_problem",
    "is_int",
    "settings_problems",
    "version_in_range",
]


@runtime_checkable
class Module(Protocol):
    """A unit of functionality: its groups of methods, its migrations and its jobs.

    ``actions`` lists only the IAM actions the module checks or records outside its methods (JoinService's
    ``compute:nodes:join``, say): every method's action is derived from its declaration. ``core_range`` is the
    range of core versions it supports (``">=0.1,<0.2"``); ``better_compute()`` refuses a module whose range excludes
    the running core. ``migrations`` maps a store dialect (``"postgresql"``) to its
    steps. ``start`` runs in ``initialize()`` after migrations; ``stop`` in ``stop()``.

    Optional member, not part of this protocol so that modules without it still conform: ``reconcilers``, a
    sequence of ``bettercompute.Reconciler`` (read with ``getattr(module, "reconcilers", ())``), run by the worker
    processes of each reconciler's role on the shards they own, and by ``jobs.tick()``; ``workflows``, a sequence of
    ``bettercompute.Workflow`` (read the same way), started with ``compute.workflows.start``; ``repositories``, the
    typed keys (``bettercompute.ports.Repository``) of the store repositories it uses, which ``better_compute()``
    checks the store ships; ``gateway_methods``, its ``bettercompute.GatewayMethod``s; ``tunnel_checks``, a mapping
    from the resource types whose tunnels it opens (``open_tunnel_in``) to a ``bettercompute.TunnelCheck`` that says
    when an open one must close (``docs/tunnels.md``); ``unavailable``, ``None`` or why the module cannot serve in
    this composition (an option it needs is not set): its groups stay registered, and every call of them answers
    ``FAILED_PRECONDITION`` with that text (after authentication, before anything else); ``sealed``, the typed keys
    (``Repository[bettercompute.ports.Sealed]``) of each stored column of KMS blobs it keeps, which a re-wrap
    (``keys.rewrap``) opens and seals again under the current key.
    """

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def core_range(self) -> str: ...
    @property
    def groups(self) -> Sequence[type[GroupSpec[Any]]]: ...
    @property
    def actions(self) -> Sequence[str]: ...
    @property
    def migrations(self) -> Mapping[str, Sequence[Migration]]: ...
    @property
    def jobs(self) -> Sequence[Job]: ...

    async def start(self, context: ModuleContext) -> None: ...
    async def stop(self) -> None: ...


@attrs.frozen(kw_only=True)
class Intercepted:
    """One method call as the plugin chain carries it: the call's context (``call``: the method, the caller, the
    decision, the module context) and its decoded ``input``.

    One frozen object rather than positional arguments, so the core can add fields without breaking a plugin; a plugin
    that hands on a changed input passes ``attrs.evolve(intercepted, input=...)`` to ``next``.
    """

    call: CallContext
    input: Any


Next = Callable[[Intercepted], Awaitable[Any]]
"""The rest of the chain, the handler innermost: ``await next(intercepted)`` returns the method's output."""


@runtime_checkable
class Plugin(Protocol):
    """Wraps method calls after authorization: ``intercept`` gets the call (``Intercepted``) and the next link, the
    handler innermost.

    A plugin never sees a call IAM refused: authorization is part of the dispatcher, not a link of this chain.
    """

    @property
    def name(self) -> str: ...
    @property
    def core_range(self) -> str: ...
    @property
    def actions(self) -> Sequence[str]: ...

    async def intercept(self, intercepted: Intercepted, next: Next) -> Any: ...


_VERSION = re.compile(r"^\d+(\.\d+)*$")
_CLAUSE = re.compile(r"^(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)$")


def _parse(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    a = a + (0,) * (width - len(a))
    b = b + (0,) * (width - len(b))
    return (a > b) - (a < b)


def version_in_range(version: str, spec: str) -> bool:
    """Whether ``version`` (``0.1.0``) satisfies ``spec`` (``">=0.1,<0.2"``).

    Raises:
        ValueError: the version or the range is malformed.
    """
    base = version.split("+")[0].split("-")[0]
    if not _VERSION.match(base):
        raise ValueError(f"malformed version {version!r}")
    have = _parse(base)
    clauses = [c.strip() for c in spec.split(",") if c.strip()]
    if not clauses:
        raise ValueError("an empty version range")
    for clause in clauses:
        match = _CLAUSE.match(clause)
        if not match:
            raise ValueError(f"malformed version range clause {clause!r}")
        op, want = match.group(1), _parse(match.group(2))
        c = _cmp(have, want)
        ok = {">=": c >= 0, "<=": c <= 0, "==": c == 0, "!=": c != 0, ">": c > 0, "<": c < 0}[op]
        if not ok:
            return False
    return True


_INT_LIMIT = 2**31 - 1  # no count or size of these settings is sensible beyond a PostgreSQL integer
# Far beyond any sensible setting, yet small enough that now + it stays a timestamp (a settings class may be stricter).
_DURATION_LIMIT = dt.timedelta(days=365250)


def is_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` proper: ``True`` is an ``int`` to Python but never a count."""
    return isinstance(value, int) and not isinstance(value, bool)


def duration_problem(name: str, value: object, *, at_least: dt.timedelta, at_most: dt.timedelta) -> str | None:
    """The problem with ``value`` as the duration option ``name``, or ``None`` when it is one within the bounds."""
    if not isinstance(value, dt.timedelta):
        return f"{name}: must be a datetime.timedelta, not {type(value).__name__}"
    if value < at_least:
        return f"{name}: must be at least {_describe(at_least)}"
    if value > at_most:
        return f"{name}: must be at most {_describe(at_most)}"
    return None


def _describe(duration: dt.timedelta) -> str:
    named = {
        dt.timedelta(milliseconds=1): "one millisecond",
        dt.timedelta(seconds=1): "one second",
        dt.timedelta(days=1): "one day",
    }
    return named.get(duration, str(duration))


def settings_problems(prefix: str, settings: attrs.AttrsInstance) -> list[str]:
    """Fields of an attrs settings object (``WebhookSettings``, ``JoinSettings``, ``Job``) whose value is not of the
    declared type, or a count or duration no deployment means (beyond a PostgreSQL integer, or 1000 years).

    Checked before the object's own ``problems()``, which compares values and would raise ``TypeError`` on a
    ``str`` where a ``timedelta`` belongs. Fields of types other than ``int``, ``bool``, ``str`` and ``timedelta``
    (optionally ``None``) are left to the caller.
    """
    cls = type(settings)
    namespace = vars(sys.modules[cls.__module__])
    problems = []
    for field in attrs.fields(cls):
        try:
            # One field at a time: another's annotation may name a class imported only for type checkers.
            holder = types.SimpleNamespace(__annotations__={field.name: field.type})
            expected = typing.get_type_hints(holder, globalns=namespace)[field.name]
        except Exception:  # noqa: S112 - an annotation that resolves only for type checkers: not checked here
            continue
        value = getattr(settings, field.name)
        problem = _type_problem(expected, value)
        if problem is not None:
            problems.append(f"{prefix}.{field.name}: {problem}")
    return problems


def _type_problem(expected: Any, value: object) -> str | None:
    union = typing.get_origin(expected) in (typing.Union, types.UnionType)
    allowed = typing.get_args(expected) if union else (expected,)
    if value is None and type(None) in allowed:
        return None
    checked = [t for t in allowed if t in (int, bool, str, dt.timedelta)]
    if len(checked) < len([t for t in allowed if t is not type(None)]):
        return None  # a type this check does not know: the caller's own checks cover it
    for kind in checked:
        if kind is int and is_int(value):
            return None if abs(value) <= _INT_LIMIT else f"must be at most {_INT_LIMIT} in size"
        if kind is dt.timedelta and isinstance(value, dt.timedelta):
            return None if abs(value) <= _DURATION_LIMIT else "must be at most 1000 years"
        if kind in (bool, str) and isinstance(value, kind):
            return None
    names = " or ".join("datetime.timedelta" if t is dt.timedelta else t.__name__ for t in allowed)
    return f"must be {names.replace('NoneType', 'None')}, not {type(value).__name__}"


@attrs.frozen(kw_only=True)
class StaticModule:
    """A module made only of declarations (groups, actions, migrations, jobs), with nothing to start or stop."""

    name: str
    version: str
    core_range: str
    groups: Sequence[type[GroupSpec[Any]]] = ()
    actions: Sequence[str] = ()
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(factory=dict)
    jobs: Sequence[Job] = ()
    repositories: Sequence[Repository[Any]] = ()

    async def start(self, context: ModuleContext) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Nothing to stop."""
