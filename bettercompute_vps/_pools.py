"""The ``vps-pools`` group: how a ``vps-host`` or ``provider`` pool runs instances (overcommit ratios, per-tenant
quotas and, for a provider pool, its provider)."""

from __future__ import annotations

from typing import Any

from bettercompute import CallContext, method
from bettercompute.errors import AccessDeniedError, ComputeError, InvalidInputError, NotFoundError
from bettercompute.modules.pools import POOLS
from bettercompute.modules.secrets import SECRETS
from bettercompute.ports import ResourceRef
from bettercompute_vps._lifecycle import HOSTED, PROVIDER
from bettercompute_vps._port import VPS, PoolSettings
from bettercompute_vps._schemas import ConfigureVpsPoolInput, GetVpsPoolInput, ProviderInput, VpsPool
from bettercompute_vps._views import pool_view

__all__ = ["configure_pool", "get_pool"]

VPS_POOL = "pool"


def _on_pool(input: Any) -> ResourceRef:
    return ResourceRef(type=VPS_POOL, id=input.pool_id)


def _check_endpoint(provider: ProviderInput) -> None:
    """Refuse settings the EC2 adapter would refuse at the first launch (when it is installed)."""
    try:
        from bettercompute_vps._ec2 import Ec2Settings
    except ImportError:  # boto3 is not installed: the workflow says so at the launch
        return
    settings = {"region": provider.region, "endpoint_url": provider.endpoint_url, "subnet_id": provider.subnet_id}
    try:
        Ec2Settings.from_mapping({k: v for k, v in settings.items() if v is not None})
    except ComputeError as exc:
        path = exc.details.get("path") if isinstance(exc.details, dict) else None
        raise InvalidInputError(
            f"provider.{path or 'endpoint_url'}: {exc.message}", details={"path": f"provider.{path or 'endpoint_url'}"}
        ) from None


@method(mutates=True, resource=_on_pool)
async def configure_pool(call: CallContext, input: ConfigureVpsPoolInput) -> VpsPool:
    """Set how a ``vps-host`` or ``provider`` pool runs instances: overcommit ratios, per-tenant quotas and, for a
    provider pool, the provider (region, endpoint, the credentials' secret name, the instance types it may use).

    Raises:
        NotFoundError: no such pool.
        InvalidInputError: not a VPS pool; a provider pool without ``provider`` or a hosted pool with one; a
            credentials secret not scoped to the pool; an instance type named twice.
    """
    pool = await call.context.store.repository(POOLS).get(input.pool_id)
    if pool is None:
        raise NotFoundError("no such pool", details={"path": "pool_id"})
    if pool.pool_class not in (HOSTED, PROVIDER):
        reason = f"the pool is of class {pool.pool_class}, not vps-host or provider"
        raise InvalidInputError(f"pool_id: {reason}", details={"path": "pool_id", "reason": reason})
    provider: dict[str, Any] | None = None
    if pool.pool_class == PROVIDER:
        if input.provider is None:
            raise InvalidInputError("provider: a provider pool needs one", details={"path": "provider"})
        if input.provider.endpoint_url is not None:
            # The workers call the endpoint from inside the control plane's network: only an operator (a caller of
            # the root tenant) points a pool at one, never a tenant (it would probe internal addresses with it).
            identity = call.identity
            if identity is None or not identity.is_root:
                raise AccessDeniedError(
                    "only an operator of the root tenant may set a provider endpoint_url",
                    details={"path": "provider.endpoint_url", "reason": "operator_only"},
                )
            _check_endpoint(input.provider)
        names = [t.name for t in input.provider.instance_types]
        if not names or len(set(names)) != len(names):
            reason = "name at least one instance type, each once"
            raise InvalidInputError(
                f"provider.instance_types: {reason}", details={"path": "provider.instance_types", "reason": reason}
            )
        found = await call.context.store.repository(SECRETS).named(
            input.provider.credentials_secret, scopes=[f"pool:{pool.id}"], tenant=pool.tenant
        )
        if not found:
            reason = "no secret of that name scoped to this pool (secrets.create with scope pool:<id>)"
            raise InvalidInputError(
                f"provider.credentials_secret: {reason}",
                details={"path": "provider.credentials_secret", "reason": reason},
            )
        provider = {
            "kind": input.provider.kind,
            "region": input.provider.region,
            "credentials_secret": input.provider.credentials_secret,
            "endpoint_url": input.provider.endpoint_url,
            "subnet_id": input.provider.subnet_id,
            "instance_types": [
                {"name": t.name, "vcpu": t.vcpu, "memory_mib": t.memory_mib, "gpus": t.gpus}
                for t in input.provider.instance_types
            ],
        }
    elif input.provider is not None:
        raise InvalidInputError("provider: only a provider pool has one", details={"path": "provider"})
    async with call.transaction() as tx:
        settings = await tx.repository(VPS).configure_pool(
            PoolSettings(
                pool_id=pool.id,
                tenant=pool.tenant,
                cpu_ratio=input.cpu_ratio,
                memory_ratio=input.memory_ratio,
                max_instances=input.max_instances,
                max_vcpu=input.max_vcpu,
                max_memory_mib=input.max_memory_mib,
                provider=provider,
                updated_at=call.context.clock.now(),
            )
        )
        call.describe(
            resource_type=VPS_POOL,
            resource_id=pool.id,
            tenant=pool.tenant,
            details={"cpu_ratio": input.cpu_ratio, "memory_ratio": input.memory_ratio},
        )
    return pool_view(settings, pool.pool_class)


@method(mutates=False, resource=_on_pool)
async def get_pool(call: CallContext, input: GetVpsPoolInput) -> VpsPool:
    """A VPS pool's settings (defaults when never configured)."""
    pool = await call.context.store.repository(POOLS).get(input.pool_id)
    if pool is None:
        raise NotFoundError("no such pool", details={"path": "pool_id"})
    settings = await call.context.store.repository(VPS).pool(pool.id)
    if settings is None:
        settings = PoolSettings(
            pool_id=pool.id,
            tenant=pool.tenant,
            cpu_ratio=1.0,
            memory_ratio=1.0,
            max_instances=None,
            max_vcpu=None,
            max_memory_mib=None,
            provider=None,
            updated_at=pool.updated_at,
        )
    return pool_view(settings, pool.pool_class)
