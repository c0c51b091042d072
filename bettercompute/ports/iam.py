"""What the core needs of IAM: identities, resources and decisions."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs

__all__ = ["Decision", "FreshIam", "Iam", "Identity", "ResourceRef"]


@attrs.frozen(kw_only=True)
class ResourceRef:
    """What an action is checked on: a resource type, optionally one resource, and where it lives."""

    type: str
    id: str | None = None
    tenant: str | None = None
    pool: str | None = None


@attrs.frozen(kw_only=True)
class Identity:
    """Who is calling, as established by ``Iam.authenticate``."""

    principal_id: str
    principal_name: str
    kind: str
    tenant_id: str
    is_root: bool
    credential_id: str


@attrs.frozen(kw_only=True)
class Decision:
    """One allowing authorization decision; its ``id`` goes into the audit row of the mutation it allowed."""

    id: str
    action: str
    resource: ResourceRef
    principal_id: str


class Iam(Protocol):
    """Authentication and authorization, embedded or remote.

    The dispatcher calls ``authenticate`` once per request and ``require`` once per call, after the tenant pre-check.
    An IAM that also declares methods (the embedded one) is a ``Module`` as well and is registered as one.
    """

    async def authenticate(self, credential: str) -> Identity:
        """The identity behind a credential.

        Raises ``UnauthenticatedError`` for a garbled, unknown, expired or revoked credential (a garbled one without
        any database lookup) and ``UnavailableError`` when it cannot tell.
        """
        ...

    async def require(self, identity: Identity, action: str, resource: ResourceRef) -> Decision:
        """Allow (returning the decision) or raise ``AccessDeniedError``.

        For a ``resource.id`` the identity may not see (another tenant's, or unknown) it may raise
        ``NotFoundError("no such <type>", details={"id": ...})`` instead (``<type>`` with ``-`` read as a space),
        the same answer a handler gives for a missing id, so the two cases cannot be told apart.
        """
        ...


@runtime_checkable
class FreshIam(Protocol):
    """An IAM that can decide from the database itself, never from a cache: what keeps a long-lived grant honest (an
    open tunnel is re-checked every second; a revocation must end it in seconds, not in a cache's lifetime)."""

    async def require_fresh(self, identity: Identity, action: str, resource: ResourceRef) -> Decision:
        """``Iam.require``, with the credential and the principal's grants read now.

        Raises ``UnauthenticatedError`` when the identity's credential is revoked, expired or gone (or its principal
        disabled), and ``AccessDeniedError`` or ``NotFoundError`` as ``require`` does.
        """
        ...
