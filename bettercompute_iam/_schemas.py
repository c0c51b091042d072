"""Inputs and outputs of IAM's method groups: tenants, principals, credentials, roles, bindings.

Tenant-scoped inputs name their tenant (its id, ``root`` or ``tn_…``) in a ``tenant`` field, the way a Kubernetes
request names its namespace: the core's tenant pre-check refuses a caller from another tenant before any database
access. Field rules are declared with ``bettercompute.fields`` (the codec enforces them as ``INVALID_INPUT`` at the
field's path, the OpenAPI document publishes them); the few no JSON Schema keyword expresses are plain validators.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, ClassVar, Literal

import attrs

from bettercompute.fields import Integer, Items, Text
from bettercompute.paging import PageInput

__all__ = [
    "Binding",
    "CreateBindingInput",
    "CreateCredentialInput",
    "CreatePrincipalInput",
    "CreateRoleInput",
    "CreateTenantInput",
    "CreatedCredential",
    "CredentialInfo",
    "DeleteBindingInput",
    "DeleteBindingOutput",
    "DisablePrincipalInput",
    "ListBindingsInput",
    "ListBindingsOutput",
    "ListCredentialsInput",
    "ListCredentialsOutput",
    "ListPrincipalsInput",
    "ListPrincipalsOutput",
    "ListRolesInput",
    "ListRolesOutput",
    "ListTenantsInput",
    "ListTenantsOutput",
    "Principal",
    "RevokeCredentialInput",
    "Role",
    "Tenant",
]

MIN_EXPIRY_SECONDS = 60
MAX_EXPIRY_SECONDS = 10 * 366 * 24 * 3600
"""Ten years, leap days included."""

RESERVED_ROLE_PREFIX = "compute."
"""Built-in roles are named ``compute.*``; custom roles may not be."""

_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_DNS_LABEL = Text(
    pattern=r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?",
    reason="must be a lowercase DNS label: 1 to 63 of a-z, 0-9 and '-', alphanumeric ends",
)
_PRINCIPAL_NAME = Text(
    pattern=r"[a-z0-9]([a-z0-9._@-]{0,126}[a-z0-9])?",
    reason="must be 1 to 128 of a-z, 0-9, '.', '_', '@' and '-', starting and ending alphanumeric",
)
_ROLE_NAME = Text(
    pattern=r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?",
    reason="must be 1 to 63 of a-z, 0-9, '.', '_' and '-', starting and ending alphanumeric",
)
_IDENTIFIER = Text(pattern=_ID.pattern, reason="must be an id of 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
_DESCRIPTION = Text(max_length=256, reason="must be at most 256 characters")
_EXPIRY = Integer(
    minimum=MIN_EXPIRY_SECONDS,
    maximum=MAX_EXPIRY_SECONDS,
    reason=f"must be null (never) or between {MIN_EXPIRY_SECONDS} and {MAX_EXPIRY_SECONDS} seconds",
)
_PATTERNS = Items(min_items=1, max_items=100, reason="must hold 1 to 100 action patterns")


def _fail(attribute: attrs.Attribute[Any], value: Any, reason: str) -> ValueError:
    # attrs' own convention (message, attribute, value): the codec reads the attribute to name the field's path.
    return ValueError(reason, attribute, value)


def _reserved_prefix(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    # Beside the declared rule: the document cannot say "not starting with" without a look-ahead.
    if value.startswith(RESERVED_ROLE_PREFIX):
        raise _fail(attribute, value, f"may not start with {RESERVED_ROLE_PREFIX!r}: that prefix is for built-in roles")


def _scope_id(instance: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    # attrs runs validators after every field is set, so the other fields are there to compare with.
    scope_type = instance.scope_type
    if scope_type == "root" and value is not None:
        raise _fail(attribute, value, "must be null for the root scope")
    if scope_type == "tenant" and value is not None and value != instance.tenant:
        raise _fail(attribute, value, "must be the binding's tenant (or null) for a tenant scope")
    if scope_type == "pool" and (value is None or not _ID.fullmatch(value)):
        raise _fail(attribute, value, "must be the pool's id for a pool scope")


# --- tenants ----------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateTenantInput:
    """A new tenant's name: a lowercase DNS label, unique."""

    name: str = attrs.field(validator=_DNS_LABEL)


@attrs.frozen(kw_only=True)
class Tenant:
    """A tenant: the unit of isolation that principals, roles and resources belong to."""

    id: str
    name: str
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class ListTenantsInput(PageInput):
    """Only the paging fields."""


@attrs.frozen(kw_only=True)
class ListTenantsOutput:
    """A page of every tenant, oldest first; ``next_cursor`` is null on the last page."""

    tenants: tuple[Tenant, ...]
    next_cursor: str | None


# --- principals -------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreatePrincipalInput:
    """A new user or service account in ``tenant``; the name is unique in the tenant."""

    tenant: str = attrs.field(validator=_IDENTIFIER)
    name: str = attrs.field(validator=_PRINCIPAL_NAME)
    kind: Literal["user", "service_account"]


@attrs.frozen(kw_only=True)
class Principal:
    """A user or a service account of one tenant. A disabled principal's credentials no longer work."""

    id: str
    tenant: str
    name: str
    kind: Literal["user", "service_account"]
    disabled_at: dt.datetime | None
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class ListPrincipalsInput(PageInput):
    """The tenant whose principals to list."""

    tenant: str = attrs.field(validator=_IDENTIFIER)


@attrs.frozen(kw_only=True)
class ListPrincipalsOutput:
    """A page of the tenant's principals, oldest first; ``next_cursor`` is null on the last page."""

    principals: tuple[Principal, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class DisablePrincipalInput:
    """The principal to disable, in ``tenant``."""

    tenant: str = attrs.field(validator=_IDENTIFIER)
    principal_id: str = attrs.field(validator=_IDENTIFIER)


# --- credentials ------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateCredentialInput:
    """A new API credential for a principal of ``tenant``.

    ``expires_in_seconds`` must be given: ``null`` for a credential that never expires, else 60 s to 10 years.
    """

    tenant: str = attrs.field(validator=_IDENTIFIER)
    principal_id: str = attrs.field(validator=_IDENTIFIER)
    expires_in_seconds: int | None = attrs.field(validator=_EXPIRY)
    description: str = attrs.field(default="", validator=_DESCRIPTION)


@attrs.frozen(kw_only=True)
class CreatedCredential:
    """A new credential. ``credential`` (``bcak_<id>.<secret>``) is shown here once and never again."""

    id: str
    principal_id: str
    credential: str = attrs.field(repr=False)
    expires_at: dt.datetime | None
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class CredentialInfo:
    """What may be known about a credential: never its secret or its hash."""

    id: str
    principal_id: str
    description: str
    created_at: dt.datetime
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None
    state: Literal["active", "revoked", "expired"]


@attrs.frozen(kw_only=True)
class ListCredentialsInput(PageInput):
    """The credentials of ``tenant``, or of one of its principals."""

    tenant: str = attrs.field(validator=_IDENTIFIER)
    principal_id: str | None = attrs.field(default=None, validator=_IDENTIFIER)


@attrs.frozen(kw_only=True)
class ListCredentialsOutput:
    """A page of credentials, oldest first; ``next_cursor`` is null on the last page."""

    credentials: tuple[CredentialInfo, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class RevokeCredentialInput:
    """The credential to revoke, in ``tenant``."""

    tenant: str = attrs.field(validator=_IDENTIFIER)
    credential_id: str = attrs.field(validator=_IDENTIFIER)


# --- roles ------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateRoleInput:
    """A custom role of ``tenant``: a set of action patterns (``compute:reservations:*``), each matching an action."""

    tenant: str = attrs.field(validator=_IDENTIFIER)
    name: str = attrs.field(validator=attrs.validators.and_(_ROLE_NAME, _reserved_prefix))
    actions: tuple[str, ...] = attrs.field(validator=_PATTERNS)
    description: str = attrs.field(default="", validator=_DESCRIPTION)


@attrs.frozen(kw_only=True)
class Role:
    """A role: built-in (``compute.*``, no tenant, ``id`` is the name) or a custom role of one tenant."""

    id: str
    tenant: str | None
    name: str
    actions: tuple[str, ...]
    description: str
    builtin: bool
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class ListRolesInput(PageInput):
    """The tenant whose roles to list (the built-in roles come with every tenant)."""

    tenant: str = attrs.field(validator=_IDENTIFIER)


@attrs.frozen(kw_only=True)
class ListRolesOutput:
    """A page of roles: the built-in ones, then the tenant's, oldest first; ``next_cursor`` is null on the last page."""

    roles: tuple[Role, ...]
    next_cursor: str | None


# --- bindings ---------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateBindingInput:
    """Give ``role`` to a principal of ``tenant`` on a scope.

    ``role`` is a built-in role's name (``compute.member``) or the id of a custom role of this tenant. ``scope_id`` is
    null for ``root``, the tenant (or null) for ``tenant``, and the pool's id for ``pool``.
    """

    # ``_scope_id`` enforces this; the document says it. A tenant scope's id may also be the tenant itself, which
    # JSON Schema cannot compare; the document asks for null there, which is always accepted.
    __json_schema__: ClassVar[dict[str, Any]] = {
        "allOf": [
            {
                "if": {"properties": {"scope_type": {"enum": ["root", "tenant"]}}},
                "then": {"properties": {"scope_id": {"type": "null"}}},
            },
            {
                "if": {"properties": {"scope_type": {"const": "pool"}}},
                "then": {
                    "required": ["scope_id"],
                    "properties": {"scope_id": {"type": "string", **_IDENTIFIER.schema()}},
                },
            },
        ]
    }

    tenant: str = attrs.field(validator=_IDENTIFIER)
    principal_id: str = attrs.field(validator=_IDENTIFIER)
    role: str = attrs.field(validator=_IDENTIFIER)
    scope_type: Literal["root", "tenant", "pool"]
    scope_id: str | None = attrs.field(default=None, validator=_scope_id)


@attrs.frozen(kw_only=True)
class Binding:
    """A role given to a principal on a scope; ``tenant`` is the principal's tenant."""

    id: str
    tenant: str
    principal_id: str
    role: str
    role_name: str
    scope_type: Literal["root", "tenant", "pool"]
    scope_id: str | None
    created_at: dt.datetime


@attrs.frozen(kw_only=True)
class ListBindingsInput(PageInput):
    """The bindings of ``tenant``'s principals, or of one of them."""

    tenant: str = attrs.field(validator=_IDENTIFIER)
    principal_id: str | None = attrs.field(default=None, validator=_IDENTIFIER)


@attrs.frozen(kw_only=True)
class ListBindingsOutput:
    """A page of bindings, oldest first; ``next_cursor`` is null on the last page."""

    bindings: tuple[Binding, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class DeleteBindingInput:
    """The binding to delete, in ``tenant``."""

    tenant: str = attrs.field(validator=_IDENTIFIER)
    binding_id: str = attrs.field(validator=_IDENTIFIER)


@attrs.frozen(kw_only=True)
class DeleteBindingOutput:
    """``deleted`` is true once the binding is gone (an unknown binding is ``NOT_FOUND``, not ``false``)."""

    deleted: bool
