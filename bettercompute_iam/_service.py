"""The logic of IAM's method groups: plain async functions of ``(call, input)``.

Every mutation is one transaction holding the change and its audit row (which carries the id of the one decision
that allowed it). Caches are cleared after the commit, so a concurrent authentication cannot put the old state back.
"""

from __future__ import annotations

import datetime as dt
import secrets

from bettercompute import CallContext, method
from bettercompute.errors import (
    AccessDeniedError,
    FailedPreconditionError,
    InvalidInputError,
    NotFoundError,
)
from bettercompute.paging import Keyset
from bettercompute.ports import Identity, ResourceRef, Transaction

from . import _credentials
from ._pg import IAM_ADMIN, IamAdmin
from ._policy import Grant, covered, not_held, pattern_problem, uncovered
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

# The caches EmbeddedIam registers (keys: a credential id, a principal id; None clears all).
CREDENTIALS_CACHE = "iam.credentials"
GRANTS_CACHE = "iam.grants"
ADMIN_ROLE = "compute.admin"

# The sort key of each list, as its statement in IamAdmin orders it (a unique key, so pages never overlap).
_TENANT_PAGES: Keyset[Tenant] = Keyset(dt.datetime, str, key=lambda t: (t.created_at, t.id))
_PRINCIPAL_PAGES: Keyset[Principal] = Keyset(dt.datetime, str, key=lambda p: (p.created_at, p.id))
_CREDENTIAL_PAGES: Keyset[CredentialInfo] = Keyset(dt.datetime, str, key=lambda c: (c.created_at, c.id))
_ROLE_PAGES: Keyset[Role] = Keyset(bool, dt.datetime, str, key=lambda r: (not r.builtin, r.created_at, r.id))
_BINDING_PAGES: Keyset[Binding] = Keyset(dt.datetime, str, key=lambda b: (b.created_at, b.id))


def _binding_scope(input: CreateBindingInput) -> ResourceRef:
    # Who may hand out a scope: only a root-scope grant the root scope; a grant on the pool, on the input's tenant or
    # on the root a pool (the handler then checks that the pool lies in a scope the caller holds).
    if input.scope_type == "root":
        return ResourceRef(type="binding")
    if input.scope_type == "pool":
        return ResourceRef(type="binding", tenant=input.tenant, pool=input.scope_id)
    return ResourceRef(type="binding", tenant=input.tenant)


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


async def may_act_on(call: CallContext, tx: Transaction, principal_id: str) -> tuple[Grant, ...]:
    """The one rule for acting on another principal: the caller must hold everything it holds.

    "Everything" is scope by scope, with one notion of containment (``_policy.contains``): a root-scope grant
    covers every scope, a tenant-scope grant covers the tenant and the pools that lie in it, a pool-scope grant
    covers that pool. So a tenant admin manages the principals of her tenant, pool bindings in it included, but not
    one that a root admin bound on the root scope or on another tenant's pool: minting or revoking its credential,
    disabling it or taking a binding away would hand its powers to her, or take them from the one who gave them.
    Acting on oneself always passes. Every method that acts on an existing principal calls this, after finding the
    principal in the input's tenant (so the refusal says nothing about other tenants' principals).

    Both principals' grants are read in ``tx``: fresh, and on the one connection the request already holds.

    Returns:
        The caller's grants, as read in ``tx``.

    Raises:
        AccessDeniedError: the principal holds something the caller does not (``details["missing"]`` lists it).
    """
    caller = _caller(call).principal_id
    grants = await tx.repository(IAM_ADMIN).grants(principal_ids=[caller, principal_id])
    missing = not_held(grants[caller], grants[principal_id])
    if missing:
        raise AccessDeniedError(
            "the principal holds more than the caller does",
            details={"action": call.method.action, "missing": missing},
        )
    return grants[caller]


def _caller(call: CallContext) -> Identity:
    assert call.identity is not None, "IAM's methods are authenticated"
    return call.identity


def _listings(call: CallContext) -> IamAdmin:
    """IAM's repository outside a transaction, for the listings (a write goes through ``tx.repository``)."""
    return call.context.store.repository(IAM_ADMIN)


# --- tenants ----------------------------------------------------------------------------------------------------


@method(mutates=True, resource=lambda _: ResourceRef(type="tenant"))
async def create_tenant(call: CallContext, input: CreateTenantInput) -> Tenant:
    """Create a tenant (needs a grant on the root scope)."""
    async with call.transaction() as tx:
        tenant = await tx.repository(IAM_ADMIN).create_tenant(tenant_id=_new_id("tn"), name=input.name)
        call.describe(resource_type="tenant", resource_id=tenant.id, tenant=tenant.id, details={"name": tenant.name})
    return tenant


@method(mutates=False, resource=lambda _: ResourceRef(type="tenant"))
async def list_tenants(call: CallContext, input: ListTenantsInput) -> ListTenantsOutput:
    """A page of every tenant, oldest first (needs a grant on the root scope).

    Raises:
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _TENANT_PAGES.after(scope, input.cursor)
    found = await _listings(call).list_tenants(after=after, limit=input.limit + 1)
    tenants, next_cursor = _TENANT_PAGES.page(scope, found, input.limit)
    return ListTenantsOutput(tenants=tenants, next_cursor=next_cursor)


# --- principals -------------------------------------------------------------------------------------------------


@method(mutates=True, resource=lambda i: ResourceRef(type="principal", tenant=i.tenant))
async def create_principal(call: CallContext, input: CreatePrincipalInput) -> Principal:
    """Create a user or a service account in a tenant."""
    async with call.transaction() as tx:
        principal = await tx.repository(IAM_ADMIN).create_principal(
            principal_id=_new_id("pr"), tenant=input.tenant, name=input.name, kind=input.kind
        )
        call.describe(
            resource_type="principal",
            resource_id=principal.id,
            tenant=input.tenant,
            details={"name": principal.name, "kind": principal.kind},
        )
    return principal


@method(mutates=False, resource=lambda i: ResourceRef(type="principal", tenant=i.tenant))
async def list_principals(call: CallContext, input: ListPrincipalsInput) -> ListPrincipalsOutput:
    """A page of a tenant's principals, oldest first.

    Raises:
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _PRINCIPAL_PAGES.after(scope, input.cursor)
    found = await _listings(call).list_principals(input.tenant, after=after, limit=input.limit + 1)
    principals, next_cursor = _PRINCIPAL_PAGES.page(scope, found, input.limit)
    return ListPrincipalsOutput(principals=principals, next_cursor=next_cursor)


@method(mutates=True, resource=lambda i: ResourceRef(type="principal", id=i.principal_id, tenant=i.tenant))
async def disable_principal(call: CallContext, input: DisablePrincipalInput) -> Principal:
    """Disable a principal: its credentials stop working (in this process at once). Idempotent.

    Raises:
        NotFoundError: the tenant has no such principal.
        AccessDeniedError: the principal holds grants the caller does not (see ``may_act_on``).
        FailedPreconditionError: the caller would disable itself, or the last enabled root administrator.
    """
    if _caller(call).principal_id == input.principal_id:
        raise FailedPreconditionError(
            "a principal cannot disable itself (lockout guard)", details={"path": "principal_id"}
        )
    async with call.transaction() as tx:
        admin = tx.repository(IAM_ADMIN)
        principal = await admin.lock_principal(tenant=input.tenant, principal_id=input.principal_id, share=False)
        if principal is None:
            raise NotFoundError("no such principal in this tenant", details={"principal_id": input.principal_id})
        await may_act_on(call, tx, principal.id)
        changed = principal.disabled_at is None
        if changed:
            admins = await admin.root_admins(without_principal=principal.id)
            if admins.total > 0 and admins.remaining == 0:
                raise FailedPreconditionError(
                    f"this is the last enabled principal with {ADMIN_ROLE} on the root scope (lockout guard)",
                    details={"principal_id": principal.id},
                )
            principal = await admin.disable_principal(principal_id=principal.id)
        call.describe(
            resource_type="principal", resource_id=principal.id, tenant=input.tenant, details={"changed": changed}
        )
    # The credential cache is keyed by credential; dropping it all is cheap and certain.
    call.context.caches.invalidate(CREDENTIALS_CACHE, None)
    call.context.caches.invalidate(GRANTS_CACHE, principal.id)
    return principal


# --- credentials ------------------------------------------------------------------------------------------------


@method(mutates=True, resource=lambda i: ResourceRef(type="credential", tenant=i.tenant), replayable=False)
async def create_credential(call: CallContext, input: CreateCredentialInput) -> CreatedCredential:
    """Mint an API credential for a principal; the credential itself is in this answer only.

    Raises:
        AccessDeniedError: the principal holds grants the caller does not (see ``may_act_on``).
        NotFoundError: the tenant has no such principal.
        FailedPreconditionError: the principal is disabled.
    """
    credential_id, credential, secret_hash = _credentials.mint()
    async with call.transaction() as tx:
        admin = tx.repository(IAM_ADMIN)
        principal = await admin.lock_principal(tenant=input.tenant, principal_id=input.principal_id, share=True)
        if principal is None:
            raise NotFoundError("no such principal in this tenant", details={"principal_id": input.principal_id})
        # Checked once the principal is known to be this tenant's, so the refusal tells nothing about others'.
        await may_act_on(call, tx, principal.id)
        if principal.disabled_at is not None:
            raise FailedPreconditionError(
                "the principal is disabled", details={"principal_id": principal.id, "path": "principal_id"}
            )
        info = await admin.create_credential(
            credential_id=credential_id,
            principal_id=principal.id,
            secret_hash=secret_hash,
            expires_in_seconds=input.expires_in_seconds,
            description=input.description,
        )
        call.describe(
            resource_type="credential",
            resource_id=info.id,
            tenant=input.tenant,
            details={"principal_id": principal.id, "expires_in_seconds": input.expires_in_seconds},
        )
    return CreatedCredential(
        id=info.id,
        principal_id=info.principal_id,
        credential=credential,
        expires_at=info.expires_at,
        created_at=info.created_at,
    )


@method(mutates=False, resource=lambda i: ResourceRef(type="credential", tenant=i.tenant))
async def list_credentials(call: CallContext, input: ListCredentialsInput) -> ListCredentialsOutput:
    """List the credentials of a tenant, or of one of its principals (never a secret)."""
    scope = call.method.action
    after = _CREDENTIAL_PAGES.after(scope, input.cursor)
    found = await _listings(call).list_credentials(input.tenant, input.principal_id, after=after, limit=input.limit + 1)
    credentials, next_cursor = _CREDENTIAL_PAGES.page(scope, found, input.limit)
    return ListCredentialsOutput(credentials=credentials, next_cursor=next_cursor)


@method(mutates=True, resource=lambda i: ResourceRef(type="credential", id=i.credential_id, tenant=i.tenant))
async def revoke_credential(call: CallContext, input: RevokeCredentialInput) -> CredentialInfo:
    """Revoke a credential; this process refuses it at once, others within the authentication cache's time.

    Idempotent: revoking a revoked credential keeps its first revocation time.

    Raises:
        NotFoundError: the tenant has no such credential.
        AccessDeniedError: the credential's principal holds grants the caller does not (see ``may_act_on``).
    """
    async with call.transaction() as tx:
        admin = tx.repository(IAM_ADMIN)
        owner = await admin.lock_credential(tenant=input.tenant, credential_id=input.credential_id)
        if owner is None:
            raise NotFoundError("no such credential in this tenant", details={"credential_id": input.credential_id})
        await may_act_on(call, tx, owner)
        revoked = await admin.revoke_credential(tenant=input.tenant, credential_id=input.credential_id)
        if revoked is None:
            raise NotFoundError("no such credential in this tenant", details={"credential_id": input.credential_id})
        info, changed = revoked
        call.describe(
            resource_type="credential",
            resource_id=info.id,
            tenant=input.tenant,
            details={"principal_id": info.principal_id, "changed": changed},
        )
    call.context.caches.invalidate(CREDENTIALS_CACHE, info.id)
    return info


# --- roles ------------------------------------------------------------------------------------------------------


@method(mutates=True, resource=lambda i: ResourceRef(type="role", tenant=i.tenant))
async def create_role(call: CallContext, input: CreateRoleInput) -> Role:
    """Create a custom role in a tenant from action patterns, each matching at least one registered action.

    Raises:
        InvalidInputError: a pattern is malformed or matches no action (all of them are listed).
        NotFoundError: no such tenant.
        ConflictError: the tenant has a role of that name.
    """
    actions = tuple(dict.fromkeys(input.actions))
    problems = {p: problem for p in actions if (problem := pattern_problem(p)) is not None}
    unmatched = covered([p for p in actions if p not in problems], call.context.registry.actions())
    problems.update({p: f"{p!r} matches no action" for p in unmatched})
    if problems:
        raise InvalidInputError(
            "some action patterns are malformed or match no action",
            details={"path": "actions", "patterns": list(problems), "problems": list(problems.values())},
        )
    async with call.transaction() as tx:
        role = await tx.repository(IAM_ADMIN).create_role(
            role_id=_new_id("ro"),
            tenant=input.tenant,
            name=input.name,
            actions=actions,
            description=input.description,
        )
        call.describe(
            resource_type="role",
            resource_id=role.id,
            tenant=input.tenant,
            details={"name": role.name, "actions": list(role.actions)},
        )
    return role


@method(mutates=False, resource=lambda i: ResourceRef(type="role", tenant=i.tenant))
async def list_roles(call: CallContext, input: ListRolesInput) -> ListRolesOutput:
    """List the built-in roles and the tenant's own."""
    scope = call.method.action
    after = _ROLE_PAGES.after(scope, input.cursor)
    found = await _listings(call).list_roles(input.tenant, after=after, limit=input.limit + 1)
    roles, next_cursor = _ROLE_PAGES.page(scope, found, input.limit)
    return ListRolesOutput(roles=roles, next_cursor=next_cursor)


# --- bindings ---------------------------------------------------------------------------------------------------


@method(mutates=True, resource=_binding_scope)
async def create_binding(call: CallContext, input: CreateBindingInput) -> Binding:
    """Give a role to a principal of the tenant on the root scope, the tenant, or a pool.

    Raises:
        AccessDeniedError: the caller is outside the tenant, or would give more than it holds on that scope.
        NotFoundError: the tenant has no such principal, or no such role.
        ConflictError: the binding exists.
    """
    identity = _caller(call)
    # A root scope leaves the resource without a tenant, so the core's pre-check did not compare it.
    if not identity.is_root and identity.tenant_id != input.tenant:
        raise AccessDeniedError("the caller is outside this tenant", details={"action": call.method.action})
    scope_id = input.tenant if input.scope_type == "tenant" else input.scope_id
    async with call.transaction() as tx:
        admin = tx.repository(IAM_ADMIN)
        actions = await admin.role_actions(tenant=input.tenant, role=input.role)
        if actions is None:
            raise NotFoundError("no such role in this tenant", details={"path": "role", "role": input.role})
        caller_grants = (await admin.grants(principal_ids=[identity.principal_id]))[identity.principal_id]
        scope_tenant = scope_id if input.scope_type == "tenant" else None
        if input.scope_type == "pool" and scope_id is not None:
            scope_tenant = await admin.pool_tenant(pool_id=scope_id)
        # As in Kubernetes RBAC: nobody hands out more than they hold on that scope, so a tenant admin cannot make
        # anyone (herself included) an admin of the root scope or of another tenant's pool, and a member cannot
        # make an admin. Giving never acts against the principal, so ``may_act_on`` is not asked here.
        missing = uncovered(
            caller_grants, actions, scope_type=input.scope_type, scope_id=scope_id, scope_tenant=scope_tenant
        )
        if missing:
            raise AccessDeniedError(
                "a binding cannot give more than the caller holds on that scope",
                details={"action": call.method.action, "missing": missing},
            )
        binding = await admin.create_binding(
            binding_id=_new_id("bd"),
            tenant=input.tenant,
            principal_id=input.principal_id,
            role=input.role,
            scope_type=input.scope_type,
            scope_id=scope_id,
        )
        call.describe(
            resource_type="binding",
            resource_id=binding.id,
            tenant=input.tenant,
            details={
                "principal_id": binding.principal_id,
                "role": binding.role,
                "scope_type": binding.scope_type,
                "scope_id": binding.scope_id,
            },
        )
    call.context.caches.invalidate(GRANTS_CACHE, binding.principal_id)
    return binding


@method(mutates=False, resource=lambda i: ResourceRef(type="binding", tenant=i.tenant))
async def list_bindings(call: CallContext, input: ListBindingsInput) -> ListBindingsOutput:
    """List the bindings of a tenant's principals, or of one of them."""
    scope = call.method.action
    after = _BINDING_PAGES.after(scope, input.cursor)
    found = await _listings(call).list_bindings(input.tenant, input.principal_id, after=after, limit=input.limit + 1)
    bindings, next_cursor = _BINDING_PAGES.page(scope, found, input.limit)
    return ListBindingsOutput(bindings=bindings, next_cursor=next_cursor)


@method(mutates=True, resource=lambda i: ResourceRef(type="binding", id=i.binding_id, tenant=i.tenant))
async def delete_binding(call: CallContext, input: DeleteBindingInput) -> DeleteBindingOutput:
    """Delete a binding.

    Raises:
        NotFoundError: the tenant has no such binding.
        AccessDeniedError: a root-scope binding, and the caller is not in the root tenant; or the binding's principal
            holds grants the caller does not (see ``may_act_on``).
        FailedPreconditionError: the last root-scope ``compute.admin`` binding of an enabled principal.
    """
    async with call.transaction() as tx:
        admin = tx.repository(IAM_ADMIN)
        binding = await admin.lock_binding(tenant=input.tenant, binding_id=input.binding_id)
        if binding is None:
            raise NotFoundError("no such binding in this tenant", details={"binding_id": input.binding_id})
        if binding.scope_type == "root":
            if not _caller(call).is_root:
                raise AccessDeniedError(
                    "only a principal of the root tenant may delete a root-scope binding",
                    details={"action": call.method.action, "binding_id": binding.id},
                )
            if binding.role == ADMIN_ROLE and (await admin.root_admins(without_binding=binding.id)).remaining == 0:
                raise FailedPreconditionError(
                    f"this is the last root-scope {ADMIN_ROLE} binding of an enabled principal (lockout guard)",
                    details={"binding_id": binding.id},
                )
        await may_act_on(call, tx, binding.principal_id)
        await admin.delete_binding(binding_id=binding.id)
        call.describe(
            resource_type="binding",
            resource_id=binding.id,
            tenant=input.tenant,
            details={"principal_id": binding.principal_id, "role": binding.role, "scope_type": binding.scope_type},
        )
    call.context.caches.invalidate(GRANTS_CACHE, binding.principal_id)
    return DeleteBindingOutput(deleted=True)
