"""A test double of the ``Iam`` port, for unit tests that must not need a database. Never a default anywhere."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping

from bettercompute.errors import AccessDeniedError, UnauthenticatedError
from bettercompute.ports import Decision, Identity, ResourceRef

__all__ = ["StaticIamDouble", "identity"]


class StaticIamDouble:
    """Knows a fixed set of credentials and allows each identity a fixed set of actions (``"*"`` for all).

    It counts its calls, so a test can prove a request was refused before IAM (or the database) was asked.
    """

    def __init__(
        self, identities: Mapping[str, Identity], allowed: Mapping[str, Collection[str]] | None = None
    ) -> None:
        self._identities = dict(identities)
        self._allowed = {k: frozenset(v) for k, v in (allowed or {}).items()}
        self.authentications = 0
        self.decisions: list[Decision] = []

    async def authenticate(self, credential: str) -> Identity:
        """The identity registered for ``credential``, else ``UnauthenticatedError``."""
        self.authentications += 1
        identity = self._identities.get(credential)
        if identity is None:
            raise UnauthenticatedError("the credential is unknown, revoked or expired")
        return identity

    async def require(self, identity: Identity, action: str, resource: ResourceRef) -> Decision:
        """Allow the actions listed for the principal, else ``AccessDeniedError``."""
        allowed = self._allowed.get(identity.principal_id, frozenset())
        if "*" not in allowed and action not in allowed:
            raise AccessDeniedError(f"{action} is not allowed", details={"action": action})
        decision = Decision(id=uuid.uuid4().hex, action=action, resource=resource, principal_id=identity.principal_id)
        self.decisions.append(decision)
        return decision


def identity(principal: str, *, tenant: str = "root", kind: str = "user") -> Identity:
    """An identity for tests; ``is_root`` follows from the tenant being ``root``."""
    return Identity(
        principal_id=principal,
        principal_name=principal,
        kind=kind,
        tenant_id=tenant,
        is_root=tenant == "root",
        credential_id=f"cred-{principal}",
    )
