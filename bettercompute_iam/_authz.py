"""The ``authz`` group: authentication and decisions over HTTP, for ``RemoteIam`` in other processes.

Both methods answer with this process's embedded IAM (``call.context.iam``) about a *subject*: a credential or an
identity the caller passes in, not the caller itself. The caller needs ``iam:authz:authenticate`` /
``iam:authz:decide`` on the resource ``authz``, which has no tenant, so only a root-scope binding grants them: they are
meant for the service accounts of other control-plane processes.

A refusal about the subject carries ``details["subject"] = True``; the same error without it is about the caller's
own credential or grants. The credential being checked is never logged and never echoed, not even in an error.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

from bettercompute import CallContext, GroupSpec, method
from bettercompute.errors import AccessDeniedError, NotFoundError, UnauthenticatedError
from bettercompute.ports import Decision, Identity, ResourceRef

__all__ = [
    "AUTHZ_GROUPS",
    "AuthenticateInput",
    "AuthzGroup",
    "DecideInput",
    "DecisionView",
    "IdentityView",
    "ResourceView",
]

B = TypeVar("B")


# --- schemas ----------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AuthenticateInput:
    """The credential to check (hidden from ``repr``, so no log line or traceback can show it)."""

    credential: str = attrs.field(repr=False)


@attrs.frozen(kw_only=True)
class IdentityView:
    """An ``Identity`` on the wire: who is behind a credential."""

    principal_id: str
    principal_name: str
    kind: str
    tenant_id: str
    is_root: bool
    credential_id: str

    @classmethod
    def from_identity(cls, identity: Identity) -> IdentityView:
        """The wire form of an identity."""
        return cls(
            principal_id=identity.principal_id,
            principal_name=identity.principal_name,
            kind=identity.kind,
            tenant_id=identity.tenant_id,
            is_root=identity.is_root,
            credential_id=identity.credential_id,
        )

    def to_identity(self) -> Identity:
        """The port's value."""
        return Identity(
            principal_id=self.principal_id,
            principal_name=self.principal_name,
            kind=self.kind,
            tenant_id=self.tenant_id,
            is_root=self.is_root,
            credential_id=self.credential_id,
        )


@attrs.frozen(kw_only=True)
class ResourceView:
    """A ``ResourceRef`` on the wire: what an action is checked on."""

    type: str
    id: str | None = None
    tenant: str | None = None
    pool: str | None = None

    @classmethod
    def from_ref(cls, ref: ResourceRef) -> ResourceView:
        """The wire form of a resource reference."""
        return cls(type=ref.type, id=ref.id, tenant=ref.tenant, pool=ref.pool)

    def to_ref(self) -> ResourceRef:
        """The port's value."""
        return ResourceRef(type=self.type, id=self.id, tenant=self.tenant, pool=self.pool)


@attrs.frozen(kw_only=True)
class DecideInput:
    """May ``identity`` do ``action`` on ``resource``?"""

    identity: IdentityView
    action: str
    resource: ResourceView


@attrs.frozen(kw_only=True)
class DecisionView:
    """A ``Decision`` on the wire: the allowing decision, with the id the mutation's audit row records."""

    id: str
    action: str
    resource: ResourceView
    principal_id: str

    @classmethod
    def from_decision(cls, decision: Decision) -> DecisionView:
        """The wire form of a decision."""
        return cls(
            id=decision.id,
            action=decision.action,
            resource=ResourceView.from_ref(decision.resource),
            principal_id=decision.principal_id,
        )

    def to_decision(self) -> Decision:
        """The port's value."""
        return Decision(id=self.id, action=self.action, resource=self.resource.to_ref(), principal_id=self.principal_id)


# --- service ----------------------------------------------------------------------------------------------------


# Reads nothing a viewer could use, but answers for any principal: for the authz-client role only.
@method(mutates=False, access="manage")
async def authenticate_subject(call: CallContext, input: AuthenticateInput) -> IdentityView:
    """The identity behind a credential (for another process's ``RemoteIam``)."""
    try:
        identity = await call.context.iam.authenticate(input.credential)
    except UnauthenticatedError:
        # A fresh error, not chained: nothing about the checked credential travels further than this line.
        raise UnauthenticatedError(
            "the credential checked is malformed, unknown, revoked or expired", details={"subject": True}
        ) from None
    return IdentityView.from_identity(identity)


@method(mutates=False, access="manage")
async def decide_for_subject(call: CallContext, input: DecideInput) -> DecisionView:
    """One authorization decision for an identity (for another process's ``RemoteIam``)."""
    try:
        decision = await call.context.iam.require(input.identity.to_identity(), input.action, input.resource.to_ref())
    except (AccessDeniedError, NotFoundError) as exc:
        # NotFoundError: the subject asked for an id it may not see (see ``EmbeddedIam.require``).
        raise type(exc)(exc.message, details={**exc.details, "subject": True}) from None
    return DecisionView.from_decision(decision)


# --- declaration ------------------------------------------------------------------------------------------------


class AuthzGroup(GroupSpec[B]):
    """Authentication and decisions for other control-plane processes (root-scope grants only)."""

    name = "authz"
    action_prefix = "iam"
    authenticate = authenticate_subject
    decide = decide_for_subject


AUTHZ_GROUPS: tuple[type[GroupSpec[Any]], ...] = (AuthzGroup,)
