"""What modules, handlers and jobs are given: the parts of one control plane, and the clock and caches it shares."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any, Protocol, TypeVar

import attrs

from bettercompute._runtime.events import Events
from bettercompute._runtime.health import HealthOutput
from bettercompute._runtime.metrics import Metrics
from bettercompute.errors import FailedPreconditionError
from bettercompute.ports import Clock, Decision, Iam, Identity, Kms, Notifier, Repository, ResourceRef, Sealed, Store

__all__ = ["Authz", "Caches", "DatabaseClock", "ModuleContext", "Settings"]

T = TypeVar("T")


class Actions(Protocol):
    """What a module may read of the registry: the actions its methods check (``compute.registry`` has it all)."""

    def actions(self, *, access: Collection[str] | None = None) -> set[str]:
        """The actions the registered methods check (only those of methods of the given ``access`` levels)."""
        ...


class Settings:
    """The settings objects of the modules (``WebhookSettings``, ``JoinSettings``, a module's own), found by class.

    A module reads its own with ``context.settings.get(MySettings)``; the runtime holds them without knowing them.
    """

    def __init__(self, values: Iterable[object]) -> None:
        self._by_class: dict[type[Any], object] = {type(value): value for value in values}

    def get(self, kind: type[T]) -> T | None:
        """The settings of class ``kind``, or ``None`` when none were given."""
        value = self._by_class.get(kind)
        return value if isinstance(value, kind) else None

    def require(self, kind: type[T]) -> T:
        """The settings of class ``kind``.

        Raises:
            FailedPreconditionError: none were given (the module was assembled without them).
        """
        value = self.get(kind)
        if value is None:
            raise FailedPreconditionError(f"{kind.__name__} are not configured")
        return value


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

    store: Store
    iam: Iam
    clock: Clock
    registry: Actions
    events: Events
    caches: Caches
    notifier: Notifier | None
    instance: str
    module_versions: tuple[tuple[str, str], ...]
    self_check: Callable[[], Awaitable[HealthOutput]]
    kms: Kms | None = None
    lease_ttl: dt.timedelta = dt.timedelta(seconds=15)
    poll_interval: dt.timedelta = dt.timedelta(seconds=1)
    session_timeout: dt.timedelta = dt.timedelta(seconds=45)
    settings: Settings = attrs.field(factory=lambda: Settings(()))
    metrics: Metrics = attrs.field(factory=Metrics)
    """This control plane's metrics (``compute.metrics``): record on them, never on a global registry."""
    sealed: tuple[Repository[Sealed], ...] = ()
    """Every stored column of KMS blobs the modules declare (their ``sealed``), in module order."""


class Authz:
    """Authorization decisions outside a method call (the projection arrives with the IAM module)."""

    def __init__(self, iam: Iam) -> None:
        self._iam = iam

    async def require(self, identity: Identity, action: str, resource: ResourceRef) -> Decision:
        """Allow, returning the decision, or raise ``AccessDeniedError``."""
        return await self._iam.require(identity, action, resource)
