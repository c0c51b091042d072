"""The ``pools`` and ``join-tokens`` groups' declarations (actions ``compute:<group>:<method>``)."""

from __future__ import annotations

from typing import Any, TypeVar

from bettercompute._runtime.registry import GroupSpec, MethodDef
from bettercompute.modules.pools import _service
from bettercompute.modules.pools._schemas import (
    CreatedJoinToken,
    CreateJoinTokenInput,
    CreatePoolInput,
    GetJoinTokenInput,
    GetPoolInput,
    JoinToken,
    ListJoinTokensInput,
    ListJoinTokensOutput,
    ListPoolsInput,
    ListPoolsOutput,
    Pool,
    RevokeJoinTokenInput,
    UpdatePoolInput,
)
from bettercompute.ports import ResourceRef

B = TypeVar("B")


def _tenant(input: Any) -> ResourceRef:
    # Inputs naming a tenant: the core's pre-check refuses another tenant's caller before the database.
    return ResourceRef(type=_service.POOL, tenant=input.tenant)


def _pool(input: Any) -> ResourceRef:
    # The pool's projection row decides its tenant and pool (a pool not projected only passes a root-scope grant).
    pool_id = getattr(input, "pool_id", None) or input.id
    return ResourceRef(type=_service.POOL, id=pool_id, pool=pool_id)


def _token(input: Any) -> ResourceRef:
    # Projected with its pool at create: decided on the token's pool, as create and list are.
    return ResourceRef(type=_service.JOIN_TOKEN, id=input.id)


class PoolsGroup(GroupSpec[B]):
    """Pools of machines: class, acceptance checks and labels."""

    name = "pools"
    create = MethodDef(input=CreatePoolInput, output=Pool, handler=_service.create_pool, mutates=True, resource=_tenant)
    list = MethodDef(
        input=ListPoolsInput, output=ListPoolsOutput, handler=_service.list_pools, mutates=False, resource=_tenant
    )
    get = MethodDef(input=GetPoolInput, output=Pool, handler=_service.get_pool, mutates=False, resource=_pool)
    update = MethodDef(input=UpdatePoolInput, output=Pool, handler=_service.update_pool, mutates=True, resource=_pool)


class JoinTokensGroup(GroupSpec[B]):
    """One-time tokens that let machines join a pool."""

    name = "join-tokens"
    create = MethodDef(
        input=CreateJoinTokenInput,
        output=CreatedJoinToken,
        handler=_service.create_token,
        mutates=True,
        resource=_pool,
    )
    list = MethodDef(
        input=ListJoinTokensInput,
        output=ListJoinTokensOutput,
        handler=_service.list_tokens,
        mutates=False,
        resource=_pool,
    )
    get = MethodDef(
        input=GetJoinTokenInput, output=JoinToken, handler=_service.get_token, mutates=False, resource=_token
    )
    revoke = MethodDef(
        input=RevokeJoinTokenInput, output=JoinToken, handler=_service.revoke_token, mutates=True, resource=_token
    )


ACTIONS = tuple(sorted(m.action for g in (PoolsGroup, JoinTokensGroup) for m in g.methods.values()))
