"""The ``secrets`` group's logic: values sealed by the KMS on the way in, metadata only on the way out."""

from __future__ import annotations

import secrets as _random
from typing import Any

from bettercompute._runtime.registry import CallContext, method
from bettercompute.errors import InternalError, NotFoundError
from bettercompute.modules._tenants import require_tenant
from bettercompute.modules.nodes import NODES
from bettercompute.modules.pools import POOLS
from bettercompute.modules.secrets._port import SECRETS, SecretRecord
from bettercompute.modules.secrets._schemas import (
    CreateSecretInput,
    DeleteSecretInput,
    DeleteSecretOutput,
    ListSecretsInput,
    ListSecretsOutput,
    Secret,
)
from bettercompute.paging import Keyset
from bettercompute.ports import Kms, ResourceRef


def _tenant(input: Any) -> ResourceRef:
    # Every input names its tenant: the core's pre-check refuses another tenant's caller before the database.
    return ResourceRef(type="secret", id=getattr(input, "name", None), tenant=input.tenant)


def value_context(tenant: str, name: str) -> str:
    """The KMS context a secret's value is sealed under: a sealed value moved to another row won't open."""
    return f"secret:{tenant}:{name}"


def require_kms(kms: Kms | None) -> Kms:
    """The configured KMS (without one the dispatcher answers the group's calls ``FAILED_PRECONDITION`` before a
    handler runs, and no broker is made)."""
    if kms is None:
        raise InternalError("the secrets module runs without a KMS")
    return kms


def metadata(record: SecretRecord) -> Secret:
    """What callers may see of a secret."""
    return Secret(
        id=record.id,
        tenant=record.tenant,
        name=record.name,
        scope=record.scope,
        description=record.description,
        created_at=record.created_at,
    )


def _scope_not_found(kind: str) -> NotFoundError:
    # One message per kind, whether the id is unknown or another tenant's: the answer tells nothing about others.
    return NotFoundError(f"the scope names no {kind} of this tenant", details={"path": "scope"})


@method(mutates=True, resource=_tenant)
async def create(call: CallContext, input: CreateSecretInput) -> Secret:
    """Seal the value through the KMS and store it; returns the metadata only.

    The scope must name a pool or a node of the secret's own tenant. A ``site:<id>`` scope names no site yet (no
    module creates sites today), so it is refused the same way; the broker already releases site-scoped secrets,
    for the day a sites module creates both the sites and such secrets.

    Raises:
        NotFoundError: there is no such tenant (``details["path"]`` is ``tenant``), or the scope names no pool, node
            or site of the tenant (``details["path"]`` is ``scope``).
        ConflictError: the tenant has a secret of this name (delete it first to replace it).
    """
    context = call.context
    kind, _, scope_id = input.scope.partition(":")
    if kind == "pool":
        # Read before the transaction (pools are never deleted), so no request holds two connections at once.
        pool = await context.store.repository(POOLS).get(scope_id)
        if pool is None or pool.tenant != input.tenant:
            raise _scope_not_found(kind)
    elif kind != "node":
        raise _scope_not_found(kind)
    sealed = await require_kms(context.kms).encrypt(
        input.value.encode(), context=value_context(input.tenant, input.name)
    )
    record = SecretRecord(
        id=f"sec_{_random.token_hex(8)}",
        tenant=input.tenant,
        name=input.name,
        scope=input.scope,
        description=input.description,
        sealed_value=sealed,
        created_at=context.clock.now(),
    )
    async with call.transaction() as tx:
        await require_tenant(tx, input.tenant)
        if kind == "node":
            # Read in this transaction: a second pooled connection while this one is held could exhaust the pool.
            node = await tx.repository(NODES).get(scope_id)
            if node is None or node.tenant != input.tenant:
                raise _scope_not_found(kind)
        stored = await tx.repository(SECRETS).create(record)
        call.describe(
            resource_type="secret",
            resource_id=stored.id,
            tenant=input.tenant,
            details={"name": input.name, "scope": input.scope},
        )
    return metadata(stored)


# A secret's name is unique in its tenant and never changes: it is the key its pages follow.
_SECRET_PAGES: Keyset[Secret] = Keyset(str, key=lambda s: (s.name,))


@method(mutates=False, resource=_tenant)
async def list_secrets(call: CallContext, input: ListSecretsInput) -> ListSecretsOutput:
    """A page of the tenant's secrets, by name (never a value).

    Raises:
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _SECRET_PAGES.after(scope, input.cursor)
    records = await call.context.store.repository(SECRETS).for_tenant(input.tenant, after=after, limit=input.limit + 1)
    secrets, next_cursor = _SECRET_PAGES.page(scope, [metadata(r) for r in records], input.limit)
    return ListSecretsOutput(secrets=secrets, next_cursor=next_cursor)


@method(mutates=True, resource=_tenant)
async def delete(call: CallContext, input: DeleteSecretInput) -> DeleteSecretOutput:
    """Delete a secret by name.

    Raises:
        NotFoundError: the tenant has no secret of this name.
    """
    async with call.transaction() as tx:
        deleted = await tx.repository(SECRETS).delete(tenant=input.tenant, name=input.name)
        if deleted is None:
            raise NotFoundError("no secret of this name in this tenant", details={"name": input.name})
        call.describe(
            resource_type="secret",
            resource_id=deleted.id,
            tenant=input.tenant,
            details={"name": deleted.name, "scope": deleted.scope},
        )
    return DeleteSecretOutput(deleted=True)
