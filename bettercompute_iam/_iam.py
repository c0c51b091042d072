"""The embedded IAM: authentication of API credentials, and decisions from roles bound on scopes.

Any authenticated principal may read the ``system`` group (the version, its own identity, health), as a
Kubernetes user may read discovery; everything else needs a binding (see ``_policy``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import attrs

from bettercompute import GroupSpec, Job, ModuleContext
from bettercompute.errors import (
    AccessDeniedError,
    InternalError,
    InvalidConfigError,
    NotFoundError,
    UnauthenticatedError,
)
from bettercompute.ports import Decision, Identity, Migration, ResourceRef

from . import _credentials
from ._authz import AUTHZ_GROUPS
from ._methods import IAM_GROUPS
from ._pg import MIGRATIONS, ROOT_TENANT, IamTables
from ._policy import Grant, allows, builtin_roles
from ._version import __version__

__all__ = ["Bootstrap", "EmbeddedIam"]

log = logging.getLogger("bettercompute.iam")

CACHE = "iam.credentials"
GRANTS_CACHE = "iam.grants"
_TOUCH_EVERY = dt.timedelta(minutes=1)


@attrs.frozen(kw_only=True, repr=False)
class Bootstrap:
    """What ``bootstrap`` did. ``credential`` is set only when a new one was minted; show it once."""

    tenant_id: str
    principal_id: str
    credential_id: str | None
    credential: str | None
    revoked: tuple[str, ...]

    def __repr__(self) -> str:
        return (
            f"Bootstrap(tenant_id={self.tenant_id!r}, principal_id={self.principal_id!r},"
            f" credential_id={self.credential_id!r}, credential=<hidden>, revoked={self.revoked!r})"
        )


@attrs.define
class _Cached:
    identity: Identity
    until: float


@attrs.define
class _CachedGrants:
    grants: tuple[Grant, ...]
    until: float


class EmbeddedIam:
    """Better IAM inside this process, on the control plane's PostgreSQL store.

    Args:
        cache_ttl: How long an authenticated credential, and a principal's grants, are trusted without asking the
            database again (``0``: never cached). A revoke, a disable or a binding change in this process clears
            them at once; other processes notice within this time.
        cache_size: At most this many credentials (and as many principals' grants) are cached.
        timer: Where the caches read the time, in seconds; ``time.monotonic`` unless a test moves time by hand.

    Raises:
        InvalidConfigError: ``cache_ttl`` is not a ``timedelta`` of zero or more, or ``cache_size`` not a positive
            integer (every problem listed).
    """

    name = "iam"
    version = __version__
    core_range = ">=0.1,<0.2"
    groups: Sequence[type[GroupSpec[Any]]] = (*IAM_GROUPS, *AUTHZ_GROUPS)
    actions: Sequence[str] = tuple(sorted({m.action for g in (*IAM_GROUPS, *AUTHZ_GROUPS) for m in g.methods.values()}))
    migrations: Mapping[str, Sequence[Migration]] = {"postgresql": MIGRATIONS}

    def __init__(
        self,
        *,
        cache_ttl: dt.timedelta = dt.timedelta(seconds=30),
        cache_size: int = 10_000,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        problems: list[str] = []
        if not isinstance(cache_ttl, dt.timedelta) or cache_ttl < dt.timedelta(0):
            problems.append("iam.cache_ttl: must be a timedelta of zero or more")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            problems.append("iam.cache_size: must be a positive integer")
        if problems:
            raise InvalidConfigError("the embedded IAM's options are invalid", details={"problems": problems})
        self._ttl = cache_ttl.total_seconds()
        self._size = cache_size
        self._timer = timer
        self._cache: dict[str, _Cached] = {}
        self._grants: dict[str, _CachedGrants] = {}
        # Bumped by every invalidation: an answer read from the database before a revoke committed must not be
        # cached after the revoke cleared the cache (it would undo the revoke for a whole TTL).
        self._generation = 0
        self._tables: IamTables | None = None
        self._open: frozenset[str] = frozenset()  # the actions of methods open to everyone, read at start()
        self._context: ModuleContext | None = None

    @property
    def jobs(self) -> Sequence[Job]:
        """IAM's jobs, in the ``iam`` role, each under its singleton lease."""
        return (
            Job(name="expire-credentials", role="iam", interval=dt.timedelta(seconds=30), run=self._expire_job),
            Job(name="check-projection", role="iam", interval=dt.timedelta(minutes=5), run=self._check_projection),
        )

    async def _check_projection(self, context: ModuleContext) -> int:
        orphans = await self._db().orphaned_projections()
        if orphans:
            log.warning("%d projected resource(s) name a tenant that does not exist", orphans)
        return orphans

    async def _expire_job(self, context: ModuleContext) -> int:
        expired = await self._db().expire(limit=500)
        for credential_id, _, _ in expired:
            context.caches.invalidate(CACHE, credential_id)
        if expired:
            log.info("%d credential(s) reached their expiry", len(expired))
        return len(expired)

    # --- module -------------------------------------------------------------------------------------------------

    async def start(self, context: ModuleContext) -> None:
        """Bind to the control plane's store and make sure the root tenant exists."""
        self._tables = IamTables(context.store)
        self._context = context
        context.caches.register(CACHE, self._invalidate)
        context.caches.register(GRANTS_CACHE, self._invalidate_grants)
        # Methods declared ``access="open"`` need no decision; the built-in roles follow the declarations too.
        self._open = frozenset(context.registry.actions(access=("open",)))
        await self._tables.ensure_root(builtin_roles(context.registry))

    async def stop(self) -> None:
        """Forget cached credentials."""
        self._cache.clear()
        self._grants.clear()

    def _db(self) -> IamTables:
        if self._tables is None:
            raise InternalError("the IAM is used before initialize()")
        return self._tables

    # --- authentication -----------------------------------------------------------------------------------------

    async def authenticate(self, credential: str) -> Identity:
        """The identity behind an API credential (cached; see ``cache_ttl``).

        Raises:
            UnauthenticatedError: malformed (decided without a database lookup), unknown, revoked or expired.
            UnavailableError: the database cannot be reached.
        """
        parsed = _credentials.parse(credential)
        if parsed is None:
            raise UnauthenticatedError("the credential is malformed")
        key = hashlib.sha256(credential.encode()).hexdigest()
        now = self._timer()
        cached = self._cache.get(key)
        if cached is not None and cached.until > now:
            return cached.identity
        generation = self._generation
        row = await self._db().credential(parsed.id)
        if row is None or not _credentials.secret_matches(parsed.secret, row.secret_hash) or not row.usable:
            self._cache.pop(key, None)
            raise UnauthenticatedError("the credential is unknown, revoked or expired")
        identity = Identity(
            principal_id=row.principal_id,
            principal_name=row.principal_name,
            kind=row.kind,
            tenant_id=row.tenant_id,
            is_root=row.tenant_id == ROOT_TENANT,
            credential_id=row.id,
        )
        until = now + self._ttl
        if row.expires_at is not None:
            until = min(until, now + (row.expires_at - dt.datetime.now(dt.UTC)).total_seconds())
        if generation == self._generation and self._ttl > 0:
            if len(self._cache) >= self._size:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = _Cached(identity=identity, until=until)
        last = row.last_used_at
        if last is None or dt.datetime.now(dt.UTC) - last > _TOUCH_EVERY:
            await self._db().touch(row.id)
        return identity

    def _invalidate(self, credential_id: str | None) -> None:
        self._generation += 1
        if credential_id is None:
            self._cache.clear()
            return
        for key, entry in list(self._cache.items()):
            if entry.identity.credential_id == credential_id:
                del self._cache[key]

    # --- authorization ------------------------------------------------------------------------------------------

    async def require(self, identity: Identity, action: str, resource: ResourceRef) -> Decision:
        """Allow (one decision, with a fresh id) or raise ``AccessDeniedError`` or ``NotFoundError``.

        A resource given by id is looked up in the authorization projection: when it is there, its recorded tenant
        and pool decide (never the caller's); when it is not, only the tenant the input named (which the core's
        pre-check compared with the caller's) or a root-scope grant can allow it, never a pool the caller named.

        An id the caller may not see (another tenant's, or one the projection does not know while no root-scope
        grant lets the handler look) gets one answer whichever it is, so that answers never tell whether another
        tenant's id exists: ``NotFoundError("no such <type>", {"id": ...})``, the message a handler gives for a
        missing id, when the caller may do ``action`` in its own tenant, else the usual ``AccessDeniedError``.

        The principal's bindings are cached like credentials; a change made in this process clears them at once.
        """
        return await self._decide(identity, action, resource, await self._grants_of(identity.principal_id))

    async def require_fresh(self, identity: Identity, action: str, resource: ResourceRef) -> Decision:
        """``require`` decided on the database as it is now, never on a cache (``FreshIam``): the credential must
        still be usable and the principal's grants are read again.

        Raises:
            UnauthenticatedError: the credential is revoked, expired or gone.
            AccessDeniedError, NotFoundError: as ``require``.
        """
        row = await self._db().credential(identity.credential_id)
        if row is None or not row.usable or row.principal_id != identity.principal_id:
            raise UnauthenticatedError("the credential is unknown, revoked or expired")
        rows = await self._db().grants(identity.principal_id)
        grants = tuple(Grant(patterns=p, scope_type=t, scope_id=i, scope_tenant=n) for p, t, i, n in rows)
        return await self._decide(identity, action, resource, grants)

    async def _decide(
        self, identity: Identity, action: str, resource: ResourceRef, grants: Sequence[Grant]
    ) -> Decision:
        if action not in self._open:
            tenant, pool = resource.tenant, resource.pool
            if resource.id is not None:
                projected = await self._db().projected(resource.type, resource.id)
                if projected is None:
                    pool = None
                    if tenant is None and not allows(grants, action, tenant=None, pool=None):
                        self._unseen(grants, identity, action, resource)
                else:
                    if (tenant is not None and tenant != projected[0]) or (
                        projected[0] != identity.tenant_id and not identity.is_root
                    ):
                        self._unseen(grants, identity, action, resource)
                    tenant, pool = projected
            if not allows(grants, action, tenant=tenant, pool=pool):
                raise AccessDeniedError(f"{action} is not allowed here", details={"action": action})
        return Decision(id=uuid.uuid4().hex, action=action, resource=resource, principal_id=identity.principal_id)

    @staticmethod
    def _unseen(grants: Sequence[Grant], identity: Identity, action: str, resource: ResourceRef) -> NoReturn:
        """The one answer for an id the caller may not see: decided on the caller's side, never on the resource's."""
        if allows(grants, action, tenant=resource.tenant or identity.tenant_id, pool=None):
            raise NotFoundError(f"no such {resource.type.replace('-', ' ')}", details={"id": resource.id})
        raise AccessDeniedError(f"{action} is not allowed here", details={"action": action})

    async def grants_of(self, principal_id: str) -> tuple[Grant, ...]:
        """What a principal's bindings give it (cached like its decisions).

        A write that decides on grants reads them in its own transaction instead (``_service.may_act_on``), fresh
        and on the connection the request already holds.
        """
        return await self._grants_of(principal_id)

    async def _grants_of(self, principal_id: str) -> tuple[Grant, ...]:
        now = self._timer()
        cached = self._grants.get(principal_id)
        if cached is not None and cached.until > now:
            return cached.grants
        generation = self._generation
        rows = await self._db().grants(principal_id)
        grants = tuple(Grant(patterns=p, scope_type=t, scope_id=i, scope_tenant=n) for p, t, i, n in rows)
        if generation == self._generation and self._ttl > 0:
            if len(self._grants) >= self._size:
                self._grants.pop(next(iter(self._grants)))
            self._grants[principal_id] = _CachedGrants(grants=grants, until=now + self._ttl)
        return grants

    def _invalidate_grants(self, principal_id: str | None) -> None:
        self._generation += 1
        if principal_id is None:
            self._grants.clear()
        else:
            self._grants.pop(principal_id, None)

    # --- administration -----------------------------------------------------------------------------------------

    async def bootstrap(self, *, rotate: bool = False) -> Bootstrap:
        """Create the root tenant and its admin, and mint the admin's credential if it has none (or ``rotate``).

        Re-running it mints nothing unless ``rotate`` is set, which revokes the admin's other credentials.
        """
        credential_id, credential, secret_hash = _credentials.mint()
        principal_id, minted, revoked = await self._db().bootstrap(
            principal_id=f"pr_{secrets.token_hex(8)}",
            principal_name="root-admin",
            credential_id=credential_id,
            secret_hash=secret_hash,
            rotate=rotate,
        )
        for old in revoked:
            self._invalidate(old)
        self._invalidate_grants(principal_id)
        if minted:
            log.info("minted a root admin credential %s", credential_id)
        return Bootstrap(
            tenant_id=ROOT_TENANT,
            principal_id=principal_id,
            credential_id=credential_id if minted else None,
            credential=credential if minted else None,
            revoked=tuple(revoked),
        )

    async def revoke(self, credential_id: str) -> bool:
        """Revoke a credential; this process stops accepting it at once. ``False`` if it was not active."""
        revoked = await self._db().revoke([credential_id])
        if self._context is not None:
            self._context.caches.invalidate(CACHE, credential_id)
        else:
            self._invalidate(credential_id)
        return bool(revoked)
