"""Inputs and outputs of IAM's method groups: tenants, principals, credentials, roles, bindings.

Tenant-scoped inputs name their tenant (its id, ``root`` or ``tn_…``) in a ``tenant`` field, the way a Kubernetes
request names its namespace: the core's tenant pre-check refuses a caller from another tenant before any database
access. Simple field rules are attrs validators; they raise ``(message, attribute, value)`` so the codec reports
``INVALID_INPUT`` with the field's path.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any, Literal

import attrs

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

_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_PRINCIPAL_NAME = re.compile(r"[a-z0-9]([a-z0-9._@-]{0,126}[a-z0-9])?")
_ROLE_NAME = re.compile(r"[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?")
_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _fail(attribute: attrs.Attribute[Any], value: Any, reason: str) -> ValueError:
    # attrs' own convention (message, attribute, value): the codec reads the attribute to name the field's path.
    return ValueError(reason, attribute, value)


def _dns_label(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not _DNS_LABEL.fullmatch(value):
        raise _fail(attribute, value, "must be a lowercase DNS label: 1 to 63 of a-z, 0-9 and '-', alphanumeric ends")


def _principal_name(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not _PRINCIPAL_NAME.fullmatch(value):
        raise _fail(
            attribute, value, "must be 1 to 128 of a-z, 0-9, '.', '_', '@' and '-', starting and ending alphanumeric"
        )


def _role_name(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if value.startswith(RESERVED_ROLE_PREFIX):
        raise _fail(attribute, value, f"may not start with {RESERVED_ROLE_PREFIX!r}: that prefix is for built-in roles")
    if not _ROLE_NAME.fullmatch(value):
        raise _fail(attribute, value, "must be 1 to 63 of a-z, 0-9, '.', '_' and '-', starting and ending alphanumeric")


def _identifier(_: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not _ID.fullmatch(value):
        raise _fail(attribute, value, "must be an id of 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")


def _description(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if len(value) > 256:
        raise _fail(attribute, value, "must be at most 256 characters")


def _expiry(_: Any, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and not MIN_EXPIRY_SECONDS <= value <= MAX_EXPIRY_SECONDS:
        raise _fail(
            attribute, value, f"must be null (never) or between {MIN_EXPIRY_SECONDS} and {MAX_EXPIRY_SECONDS} seconds"
        )


def _patterns(_: Any, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if not 1 <= len(value) <= 100:
        raise _fail(attribute, value, "must hold 1 to 100 action patterns")


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

    name: str = attrs.field(validator=_dns_label)


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

    tenant: str = attrs.field(validator=_identifier)
    name: str = attrs.field(validator=_principal_name)
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

    tenant: str = attrs.field(validator=_identifier)


@attrs.frozen(kw_only=True)
class ListPrincipalsOutput:
    """A page of the tenant's principals, oldest first; ``next_cursor`` is null on the last page."""

    principals: tuple[Principal, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class DisablePrincipalInput:
    """The principal to disable, in ``tenant``."""

    tenant: str = attrs.field(validator=_identifier)
    principal_id: str = attrs.field(validator=_identifier)


# --- credentials ------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateCredentialInput:
    """A new API credential for a principal of ``tenant``.

    ``expires_in_seconds`` must be given: ``null`` for a credential that never expires, else 60 s to 10 years.
    """

    tenant: str = attrs.field(validator=_identifier)
    principal_id: str = attrs.field(validator=_identifier)
    expires_in_seconds: int | None = attrs.field(validator=_expiry)
    description: str = attrs.field(default="", validator=_description)


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

    tenant: str = attrs.field(validator=_identifier)
    principal_id: str | None = attrs.field(default=None, validator=_identifier)


@attrs.frozen(kw_only=True)
class ListCredentialsOutput:
    """A page of credentials, oldest first; ``next_cursor`` is null on the last page."""

    credentials: tuple[CredentialInfo, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class RevokeCredentialInput:
    """The credential to revoke, in ``tenant``."""

    tenant: str = attrs.field(validator=_identifier)
    credential_id: str = attrs.field(validator=_identifier)


# --- roles ------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateRoleInput:
    """A custom role of ``tenant``: a set of action patterns (``compute:reservations:*``), each matching an action."""

    tenant: str = attrs.field(validator=_identifier)
    name: str = attrs.field(validator=_role_name)
    actions: tuple[str, ...] = attrs.field(validator=_patterns)
    description: str = attrs.field(default="", validator=_description)


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

    tenant: str = attrs.field(validator=_identifier)


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

    tenant: str = attrs.field(validator=_identifier)
    principal_id: str = attrs.field(validator=_identifier)
    role: str = attrs.field(validator=_identifier)
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

    tenant: str = attrs.field(validator=_identifier)
    principal_id: str | None = attrs.field(default=None, validator=_identifier)


@attrs.frozen(kw_only=True)
class ListBindingsOutput:
    """A page of bindings, oldest first; ``next_cursor`` is null on the last page."""

    bindings: tuple[Binding, ...]
    next_cursor: str | None


@attrs.frozen(kw_only=True)
class DeleteBindingInput:
    """The binding to delete, in ``tenant``."""

    tenant: str = attrs.field(validator=_identifier)
    binding_id: str = attrs.field(validator=_identifier)


@attrs.frozen(kw_only=True)
class DeleteBindingOutput:
    """``deleted`` is true once the binding is gone (an unknown binding is ``NOT_FOUND``, not ``false``)."""

    deleted: bool
