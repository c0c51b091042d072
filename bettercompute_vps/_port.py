"""What the ``vps`` module needs of a store (one repository, ``VPS``), and its records."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository

__all__ = [
    "INSTANCE_FIELDS",
    "VPS",
    "HostRecord",
    "InstanceRecord",
    "PlacementAsk",
    "PoolSettings",
    "Vps",
]


@attrs.frozen(kw_only=True)
class PoolSettings:
    """A pool's VPS settings (``provider`` as configured: the credentials by secret name only)."""

    pool_id: str
    tenant: str
    cpu_ratio: float
    memory_ratio: float
    max_instances: int | None
    max_vcpu: int | None
    max_memory_mib: int | None
    provider: Mapping[str, Any] | None
    updated_at: dt.datetime


@attrs.frozen(kw_only=True)
class HostRecord:
    """A node of a ``vps-host`` pool as a host of instances: what its inventory offers and whether it takes new
    instances (``available``; ``reason`` when not). ``used_*`` sum its live instances."""

    node_id: str
    pool_id: str
    tenant: str
    vcpu: int
    memory_mib: int
    disk_gib: int
    gpus: tuple[str, ...]
    available: bool
    reason: str | None
    used_vcpu: int = 0
    used_memory_mib: int = 0
    used_disk_gib: int = 0
    used_gpus: tuple[str, ...] = ()


@attrs.frozen(kw_only=True, repr=False)
class InstanceRecord:
    """An instance as stored. ``spec`` grows with every change of what it should be (power, size, boot);
    ``observed_spec`` is the last one its node or provider workflow reported done. ``deleting``: asked to go;
    ``deleted_at``: gone, its capacity free. Its ``repr`` leaves the user data out."""

    id: str
    tenant: str
    pool_id: str
    pool_class: str
    name: str
    hostname: str
    state: str
    step: str | None
    reason: str | None
    message: str | None
    power: str
    boot: int
    spec: int
    observed_spec: int
    vcpu: int
    memory_mib: int
    disk_gib: int
    gpus: int
    image_id: str
    ssh_keys: tuple[str, ...]
    user_data: str
    ports: tuple[int, ...]
    labels: Mapping[str, str]
    node_id: str | None
    gpu_ids: tuple[str, ...]
    addresses: tuple[str, ...]
    console: str
    console_at: dt.datetime | None
    provider_id: str | None
    instance_type: str | None
    client_token: str
    workflow_id: str | None
    deleting: bool
    created_by: str
    created_at: dt.datetime
    updated_at: dt.datetime
    deleted_at: dt.datetime | None

    def __repr__(self) -> str:
        return f"InstanceRecord(id={self.id!r}, tenant={self.tenant!r}, state={self.state!r}, spec={self.spec})"


INSTANCE_FIELDS = frozenset(
    {
        "state",
        "step",
        "reason",
        "message",
        "power",
        "boot",
        "spec",
        "observed_spec",
        "vcpu",
        "memory_mib",
        "disk_gib",
        "node_id",
        "gpu_ids",
        "addresses",
        "console",
        "console_at",
        "provider_id",
        "instance_type",
        "workflow_id",
        "deleting",
        "deleted_at",
    }
)
"""The fields ``update_instance`` writes."""


@attrs.frozen(kw_only=True)
class PlacementAsk:
    """What an instance asks of a host."""

    vcpu: int
    memory_mib: int
    disk_gib: int
    gpus: int


class Vps(Protocol):
    """The ``vps_*`` tables. Writes need a transaction (``tx.repository(VPS)``)."""

    async def pool(self, pool_id: str) -> PoolSettings | None: ...

    async def configure_pool(self, settings: PoolSettings) -> PoolSettings: ...

    async def lock_pool(self, pool_id: str) -> None:
        """Serialize placement and quota checks in a pool until the transaction ends."""
        ...

    async def tenant_totals(self, pool_id: str, tenant: str) -> tuple[int, int, int]:
        """The tenant's live instances in the pool: ``(count, vcpu, memory_mib)``."""
        ...

    async def hosts(self, pool_id: str) -> list[HostRecord]:
        """The pool's hosts with what their live instances use."""
        ...

    async def host(self, node_id: str) -> HostRecord | None: ...

    async def host_offers(self, *, limit: int) -> list[dict[str, Any]]:
        """Every node of a ``vps-host`` pool with what decides its offer: ``{"node_id", "pool_id", "tenant",
        "state", "cordoned", "vm"}`` (``vm``: the ``vm`` inventory section its daemon reported, or ``None``)."""
        ...

    async def upsert_host(self, host: HostRecord) -> bool:
        """Write a host's offer; whether anything changed."""
        ...

    async def insert_instance(self, record: InstanceRecord) -> InstanceRecord | None:
        """``None`` when the tenant has a live instance of that name in the pool."""
        ...

    async def get_instance(self, instance_id: str, *, lock: bool = False) -> InstanceRecord | None: ...

    async def update_instance(self, instance_id: str, **fields: Any) -> InstanceRecord | None: ...

    async def list_instances(
        self,
        tenant: str,
        *,
        pool_id: str | None,
        include_deleted: bool,
        after: Sequence[Any] | None,
        limit: int,
    ) -> list[InstanceRecord]: ...

    async def on_node(self, node_id: str) -> list[InstanceRecord]:
        """The instances placed on a node and not deleted yet (deleting ones included)."""
        ...

    async def on_gone_nodes(self, *, limit: int) -> list[InstanceRecord]:
        """Live instances whose node is failed, retired or unreachable (the node watch's work)."""
        ...

    async def open_booking(self, record: InstanceRecord, *, at: dt.datetime) -> None:
        """Start a booking of what the instance holds now (its usage runs from ``at``)."""
        ...

    async def close_booking(self, instance_id: str, *, at: dt.datetime) -> None:
        """End the instance's open booking at ``at`` (nothing when none is open)."""
        ...

    async def usage(
        self, tenant: str, *, pool_id: str | None, start: dt.datetime, end: dt.datetime
    ) -> list[dict[str, Any]]:
        """Per pool: ``{"pool_id", "vcpu_hours", "memory_gib_hours", "disk_gib_hours", "gpu_hours"}`` of the tenant's
        bookings overlapping ``[start, end)``, clipped to it."""
        ...


VPS: Repository[Vps] = Repository(module="vps", name="vps", adapters={"postgresql": "bettercompute_vps._pg"})
