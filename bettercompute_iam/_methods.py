"""IAM's method groups: tenants, principals, credentials, roles, bindings (actions ``iam:<group>:<method>``).

Each method's resource is built from its input alone, so the core's tenant pre-check runs before any database
access; handlers then check that the addressed object really belongs to that tenant.
"""

from __future__ import annotations

from typing import Any, TypeVar

from bettercompute import GroupSpec, MethodDef
from bettercompute.ports import ResourceRef

from . import _service
from ._schemas import (
    Binding,
    CreateBindingInput,
    CreateCredentialInput,
    CreatedCredential,
    CreatePrincipalInput,
    CreateRoleInput,
    CreateTenantInput,
    CredentialInfo,
    DeleteBindingInput,
    DeleteBindingOutput,
    DisablePrincipalInput,
    ListBindingsInput,
    ListBindingsOutput,
    ListCredentialsInput,
    ListCredentialsOutput,
    ListPrincipalsInput,
    ListPrincipalsOutput,
    ListRolesInput,
    ListRolesOutput,
    ListTenantsInput,
    ListTenantsOutput,
    Principal,
    RevokeCredentialInput,
    Role,
    Tenant,
)

__all__ = ["IAM_GROUPS", "BindingsGroup", "CredentialsGroup", "PrincipalsGroup", "RolesGroup", "TenantsGroup"]

B = TypeVar("B")


def _binding_scope(input: CreateBindingInput) -> ResourceRef:
    # Who may hand out a scope: only a root-scope grant the root scope; a grant on the pool, on the input's tenant or
    # on the root a pool (the handler then checks that the pool lies in a scope the caller holds).
    if input.scope_type == "root":
        return ResourceRef(type="binding")
    if input.scope_type == "pool":
        return ResourceRef(type="binding", tenant=input.tenant, pool=input.scope_id)
    return ResourceRef(type="binding", tenant=input.tenant)


class TenantsGroup(GroupSpec[B]):
    """Tenants, the unit of isolation. Only a grant on the root scope may create or list them."""

    name = "tenants"
    action_prefix = "iam"
    create = MethodDef(
        input=CreateTenantInput,
        output=Tenant,
        handler=_service.create_tenant,
        mutates=True,
        resource=lambda _: ResourceRef(type="tenant"),
    )
    list = MethodDef(
        input=ListTenantsInput,
        output=ListTenantsOutput,
        handler=_service.list_tenants,
        mutates=False,
        resource=lambda _: ResourceRef(type="tenant"),
    )


class PrincipalsGroup(GroupSpec[B]):
    """Users and service accounts of a tenant."""

    name = "principals"
    action_prefix = "iam"
    create = MethodDef(
        input=CreatePrincipalInput,
        output=Principal,
        handler=_service.create_principal,
        mutates=True,
        resource=lambda i: ResourceRef(type="principal", tenant=i.tenant),
    )
    list = MethodDef(
        input=ListPrincipalsInput,
        output=ListPrincipalsOutput,
        handler=_service.list_principals,
        mutates=False,
        resource=lambda i: ResourceRef(type="principal", tenant=i.tenant),
    )
    disable = MethodDef(
        input=DisablePrincipalInput,
        output=Principal,
        handler=_service.disable_principal,
        mutates=True,
        resource=lambda i: ResourceRef(type="principal", id=i.principal_id, tenant=i.tenant),
    )


class CredentialsGroup(GroupSpec[B]):
    """API credentials (``bcak_<id>.<secret>``) of a tenant's principals; the secret is shown once, at creation."""

    name = "credentials"
    action_prefix = "iam"
    create = MethodDef(
        input=CreateCredentialInput,
        output=CreatedCredential,
        handler=_service.create_credential,
        mutates=True,
        resource=lambda i: ResourceRef(type="credential", tenant=i.tenant),
    )
    list = MethodDef(
        input=ListCredentialsInput,
        output=ListCredentialsOutput,
        handler=_service.list_credentials,
        mutates=False,
        resource=lambda i: ResourceRef(type="credential", tenant=i.tenant),
    )
    revoke = MethodDef(
        input=RevokeCredentialInput,
        output=CredentialInfo,
        handler=_service.revoke_credential,
        mutates=True,
        resource=lambda i: ResourceRef(type="credential", id=i.credential_id, tenant=i.tenant),
    )


class RolesGroup(GroupSpec[B]):
    """Roles: the built-in ``compute.*`` roles and a tenant's custom roles (sets of action patterns)."""

    name = "roles"
    action_prefix = "iam"
    create = MethodDef(
        input=CreateRoleInput,
        output=Role,
        handler=_service.create_role,
        mutates=True,
        resource=lambda i: ResourceRef(type="role", tenant=i.tenant),
    )
    list = MethodDef(
        input=ListRolesInput,
        output=ListRolesOutput,
        handler=_service.list_roles,
        mutates=False,
        resource=lambda i: ResourceRef(type="role", tenant=i.tenant),
    )


class BindingsGroup(GroupSpec[B]):
    """Bindings: a role given to a principal on the root scope, a tenant or a pool."""

    name = "bindings"
    action_prefix = "iam"
    create = MethodDef(
        input=CreateBindingInput,
        output=Binding,
        handler=_service.create_binding,
        mutates=True,
        resource=_binding_scope,
    )
    delete = MethodDef(
        input=DeleteBindingInput,
        output=DeleteBindingOutput,
        handler=_service.delete_binding,
        mutates=True,
        resource=lambda i: ResourceRef(type="binding", id=i.binding_id, tenant=i.tenant),
    )
    list = MethodDef(
        input=ListBindingsInput,
        output=ListBindingsOutput,
        handler=_service.list_bindings,
        mutates=False,
        resource=lambda i: ResourceRef(type="binding", tenant=i.tenant),
    )


IAM_GROUPS: tuple[type[GroupSpec[Any]], ...] = (
    TenantsGroup,
    PrincipalsGroup,
    CredentialsGroup,
    RolesGroup,
    BindingsGroup,
)
