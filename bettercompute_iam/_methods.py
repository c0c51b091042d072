"""IAM's method groups: tenants, principals, credentials, roles, bindings (actions ``iam:<group>:<method>``).

Each method's resource is built from its input alone, so the core's tenant pre-check runs before any database
access; handlers then check that the addressed object really belongs to that tenant.
"""

from __future__ import annotations

from typing import Any, TypeVar

from bettercompute import GroupSet, GroupSpec

from . import _service

__all__ = [
    "IAM_GROUPS",
    "BindingsGroup",
    "CredentialsGroup",
    "IamGroups",
    "PrincipalsGroup",
    "RolesGroup",
    "TenantsGroup",
]

B = TypeVar("B")


class TenantsGroup(GroupSpec[B]):
    """Tenants, the unit of isolation. Only a grant on the root scope may create or list them."""

    name = "tenants"
    action_prefix = "iam"
    create = _service.create_tenant
    list = _service.list_tenants


class PrincipalsGroup(GroupSpec[B]):
    """Users and service accounts of a tenant."""

    name = "principals"
    action_prefix = "iam"
    create = _service.create_principal
    list = _service.list_principals
    disable = _service.disable_principal


class CredentialsGroup(GroupSpec[B]):
    """API credentials (``bcak_<id>.<secret>``) of a tenant's principals; the secret is shown once, at creation."""

    name = "credentials"
    action_prefix = "iam"
    create = _service.create_credential
    list = _service.list_credentials
    revoke = _service.revoke_credential


class RolesGroup(GroupSpec[B]):
    """Roles: the built-in ``compute.*`` roles and a tenant's custom roles (sets of action patterns)."""

    name = "roles"
    action_prefix = "iam"
    create = _service.create_role
    list = _service.list_roles


class BindingsGroup(GroupSpec[B]):
    """Bindings: a role given to a principal on the root scope, a tenant or a pool."""

    name = "bindings"
    action_prefix = "iam"
    create = _service.create_binding
    delete = _service.delete_binding
    list = _service.list_bindings


class IamGroups(GroupSet[B]):
    """IAM's groups, typed: ``IamGroups(compute.api).tenants.create(credential, input)``, or bound to a client
    (``IamGroups(client).tenants.create(input)``)."""

    tenants: TenantsGroup[B]
    principals: PrincipalsGroup[B]
    credentials: CredentialsGroup[B]
    roles: RolesGroup[B]
    bindings: BindingsGroup[B]


IAM_GROUPS: tuple[type[GroupSpec[Any]], ...] = (
    TenantsGroup,
    PrincipalsGroup,
    CredentialsGroup,
    RolesGroup,
    BindingsGroup,
)
