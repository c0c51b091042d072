"""Records as the API shows them: an instance, a pool's provider and a VPS pool's settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bettercompute_vps._port import InstanceRecord, PoolSettings
from bettercompute_vps._schemas import Instance, InstanceType, ProviderInput, Size, VpsPool

__all__ = ["instance_view", "pool_view", "provider_view"]


def instance_view(record: InstanceRecord) -> Instance:
    """An instance as ``instances.*`` answer it (its user data and keys only counted)."""
    state: Any = record.state
    power: Any = record.power
    return Instance(
        id=record.id,
        tenant=record.tenant,
        pool_id=record.pool_id,
        pool_class=record.pool_class,
        name=record.name,
        hostname=record.hostname,
        state=state,
        step=record.step,
        reason=record.reason,
        message=record.message,
        power=power,
        size=Size(vcpu=record.vcpu, memory_mib=record.memory_mib, disk_gib=record.disk_gib, gpus=record.gpus),
        image_id=record.image_id,
        ports=record.ports,
        labels=dict(record.labels),
        node_id=record.node_id,
        provider_id=record.provider_id,
        instance_type=record.instance_type,
        addresses=record.addresses,
        ssh_authorized_keys=len(record.ssh_keys),
        user_data_bytes=len(record.user_data.encode()),
        created_at=record.created_at,
        updated_at=record.updated_at,
        deleted_at=record.deleted_at,
    )


def provider_view(provider: Mapping[str, Any] | None) -> ProviderInput | None:
    """A provider pool's provider as configured (its credentials by secret name)."""
    if provider is None:
        return None
    return ProviderInput(
        kind=provider["kind"],
        region=provider["region"],
        credentials_secret=provider["credentials_secret"],
        instance_types=tuple(InstanceType(**t) for t in provider.get("instance_types") or ()),
        endpoint_url=provider.get("endpoint_url"),
        subnet_id=provider.get("subnet_id"),
    )


def pool_view(settings: PoolSettings, pool_class: str) -> VpsPool:
    """A VPS pool's settings as ``vps-pools.*`` answer them."""
    return VpsPool(
        pool_id=settings.pool_id,
        tenant=settings.tenant,
        pool_class=pool_class,
        cpu_ratio=settings.cpu_ratio,
        memory_ratio=settings.memory_ratio,
        max_instances=settings.max_instances,
        max_vcpu=settings.max_vcpu,
        max_memory_mib=settings.max_memory_mib,
        provider=provider_view(settings.provider),
        updated_at=settings.updated_at,
    )
