"""``RemoteIam``: the ``Iam`` port answered by another process's embedded IAM, over its ``authz`` group.

An api process that does not run IAM itself points a ``RemoteIam`` at a central control plane; every process then
shares that one IAM. The remote process authenticates with a credential of its own (a service account bound on the
root scope to a role with ``iam:authz:*``).

What it caches, and why:

- Identities, for ``cache_ttl`` (30 s): a credential revoked centrally stops working here within that time, which is
  the issue's promise for other processes. ``cache_ttl=0`` asks every time. Refusals are not cached.
- Decisions, never: each ``require`` asks ``authz.decide``, so every decision id comes from the IAM that made the
  decision and a grant removed centrally takes effect as soon as the central IAM sees it. The central side caches
  the principal's grants, so a decision costs one round trip and no database query.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import time
from typing import TypeVar

import anyio
import attrs
import httpx

from bettercompute import AsyncClientBinding, AsyncClientCall
from bettercompute.client import AsyncClient
from bettercompute.errors import (
    AccessDeniedError,
    ComputeError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
)
from bettercompute.ports import Decision, Identity, ResourceRef

from . import _credentials
from ._authz import AuthenticateInput, AuthzGroup, DecideInput, IdentityView, ResourceView

__all__ = ["RemoteIam"]

log = logging.getLogger("bettercompute.iam.remote")

In = TypeVar("In")
Out = TypeVar("Out")


@attrs.define
class _Cached:
    identity: Identity
    until: float


class RemoteIam:
    """The ``Iam`` port over HTTP, against another process's ``authz`` group. Not a module: no groups, no tables.

    Use it as ``Options(iam=RemoteIam(...))`` and ``await iam.aclose()`` when the process shuts down.

    Args:
        base_url: Where the central control plane is served, e.g. ``http://iam.internal:3000``.
        credential: This process's own credential; its principal needs ``iam:authz:authenticate`` and
            ``iam:authz:decide`` on the root scope.
        endpoint: The central process's method path prefix.
        cache_ttl: How long an authenticated identity is trusted without asking again (``0``: never cached).
        cache_size: At most this many identities are cached.
        timeout: Seconds one question to the central IAM may take before it is ``UnavailableError``.
        transport: An httpx transport (``httpx.ASGITransport(app)`` in tests).
    """

    def __init__(
        self,
        base_url: str,
        credential: str,
        *,
        endpoint: str = "/api/compute",
        cache_ttl: dt.timedelta = dt.timedelta(seconds=30),
        cache_size: int = 10_000,
        timeout: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._ttl = cache_ttl.total_seconds()
        self._size = cache_size
        self._timeout = timeout
        self._cache: dict[str, _Cached] = {}
        self._client = AsyncClient(base_url, credential, endpoint=endpoint, timeout=timeout, transport=transport)
        self._authz = AuthzGroup[AsyncClientBinding](self._client, AsyncClientCall)

    async def authenticate(self, credential: str) -> Identity:
        """The identity behind a credential, from the central IAM (cached for ``cache_ttl``).

        Raises:
            UnauthenticatedError: malformed (decided here, without a request), unknown, revoked or expired.
            UnavailableError: the central IAM cannot be reached, or refuses this process's own credential.
        """
        if _credentials.parse(credential) is None:
            raise UnauthenticatedError("the credential is malformed")
        key = hashlib.sha256(credential.encode()).hexdigest()
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached.until > now:
            return cached.identity
        try:
            view = await self._ask(self._authz.authenticate, AuthenticateInput(credential=credential))
        except UnauthenticatedError:
            self._cache.pop(key, None)
            raise
        identity = view.to_identity()
        if self._ttl > 0:
            if len(self._cache) >= self._size:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = _Cached(identity=identity, until=now + self._ttl)
        return identity

    async def require(self, identity: Identity, action: str, resource: ResourceRef) -> Decision:
        """One decision by the central IAM, never cached.

        Raises:
            AccessDeniedError: the identity may not do ``action`` on ``resource``.
            NotFoundError: ``resource`` is an id the identity may not see (see ``EmbeddedIam.require``).
            UnavailableError: the central IAM cannot be reached, or refuses this process's own credential.
        """
        question = DecideInput(
            identity=IdentityView.from_identity(identity), action=action, resource=ResourceView.from_ref(resource)
        )
        view = await self._ask(self._authz.decide, question)
        return view.to_decision()

    async def _ask(self, call: AsyncClientCall[In, Out], input: In) -> Out:
        """One request to the central IAM, its answer translated into what the ``Iam`` port promises."""
        method = call.method.path
        try:
            with anyio.fail_after(self._timeout):
                return await call(input)
        except TimeoutError as exc:
            raise UnavailableError("the central IAM did not answer in time", details={"method": method}) from exc
        except (UnauthenticatedError, AccessDeniedError, NotFoundError) as exc:
            if exc.details.get("subject") is True:
                details = {k: v for k, v in exc.details.items() if k != "subject"}
                raise type(exc)(exc.message, details=details) from None
            if isinstance(exc, NotFoundError):  # never about this process's credential
                log.error("the central IAM answered %s on %s", exc.code, method)
                raise UnavailableError(
                    "the central IAM could not answer", details={"method": method, "code": exc.code}
                ) from exc
            # Without the flag the refusal is about this process's own credential: an outage for the caller,
            # not the caller's fault, and something an operator must fix.
            log.error("the central IAM refused this process's credential (%s on %s)", exc.code, method)
            raise UnavailableError(
                "the central IAM refused this process's credential", details={"method": method, "code": exc.code}
            ) from None
        except UnavailableError:
            raise
        except ComputeError as exc:
            log.error("the central IAM answered %s on %s", exc.code, method)
            raise UnavailableError(
                "the central IAM could not answer", details={"method": method, "code": exc.code}
            ) from exc

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._client.aclose()
