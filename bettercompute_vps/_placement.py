"""Where an instance goes: the node of a hosted pool with the best fit, or the instance type of a provider pool
that fits its size, within the tenant's quota in the pool.

Every function here is pure: the caller reads the hosts, the pool's settings and the tenant's totals under the
pool's placement lock, and writes what is chosen in the same transaction.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from bettercompute.errors import NoCapacityError, QuotaExceededError
from bettercompute_vps._port import HostRecord, PlacementAsk, PoolSettings
from bettercompute_vps._provider import InstanceType as CatalogType
from bettercompute_vps._provider import pick_instance_type
from bettercompute_vps._schemas import Size

__all__ = ["check_quota", "host_room", "no_capacity", "place", "provider_instance_type"]


def host_room(host: HostRecord, settings: PoolSettings | None) -> tuple[int, int, int, int]:
    """What a host can still take: ``(vcpu, memory_mib, disk_gib, gpus)`` (overcommit by the pool's ratios)."""
    cpu_ratio = settings.cpu_ratio if settings is not None else 1.0
    memory_ratio = settings.memory_ratio if settings is not None else 1.0
    return (
        math.floor(host.vcpu * cpu_ratio) - host.used_vcpu,
        math.floor(host.memory_mib * memory_ratio) - host.used_memory_mib,
        host.disk_gib - host.used_disk_gib,
        len(set(host.gpus) - set(host.used_gpus)),
    )


def place(
    hosts: Sequence[HostRecord], ask: PlacementAsk, settings: PoolSettings | None
) -> tuple[HostRecord | None, dict[str, int]]:
    """The host an ask goes to (best fit: the least vCPU room left, then memory), or ``None`` with how many hosts
    were left out for each reason (``unavailable``, ``vcpu``, ``memory``, ``disk``, ``gpus``)."""
    excluded: dict[str, int] = {}
    best: tuple[tuple[int, int, str], HostRecord] | None = None
    for host in hosts:
        if not host.available:
            excluded[host.reason or "unavailable"] = excluded.get(host.reason or "unavailable", 0) + 1
            continue
        vcpu, memory, disk, gpus = host_room(host, settings)
        short = [
            name
            for name, room, wanted in (
                ("vcpu", vcpu, ask.vcpu),
                ("memory", memory, ask.memory_mib),
                ("disk", disk, ask.disk_gib),
                ("gpus", gpus, ask.gpus),
            )
            if room < wanted
        ]
        if short:
            for name in short:
                excluded[name] = excluded.get(name, 0) + 1
            continue
        key = (vcpu - ask.vcpu, memory - ask.memory_mib, host.node_id)
        if best is None or key < best[0]:
            best = (key, host)
    return (best[1] if best is not None else None), excluded


def no_capacity(ask: PlacementAsk, hosts: Sequence[HostRecord], excluded: Mapping[str, int]) -> NoCapacityError:
    """The error for an ask no host took, with the reason a caller can act on (no hosts, none available, larger
    than any node, or a full pool)."""
    largest = max((h.vcpu for h in hosts), default=0)
    details: dict[str, Any] = {
        "size": {"vcpu": ask.vcpu, "memory_mib": ask.memory_mib, "disk_gib": ask.disk_gib, "gpus": ask.gpus},
        "hosts": len(hosts),
        "excluded": dict(excluded),
    }
    if not hosts:
        message = "the pool has no hosts yet"
        details["reason"] = "no_hosts"
    elif not any(h.available for h in hosts):
        message = "no node of the pool takes instances now (see excluded: why each is left out)"
        details["reason"] = "no_available_node"
    elif all(
        ask.vcpu > h.vcpu or ask.memory_mib > h.memory_mib or ask.disk_gib > h.disk_gib or ask.gpus > len(h.gpus)
        for h in hosts
    ):
        message = "the size is larger than any node of the pool"
        details["reason"] = "larger_than_any_node"
        details["largest_node_vcpu"] = largest
    else:
        message = "no node of the pool has room for this size now"
        details["reason"] = "pool_full"
    return NoCapacityError(message, details=details)


def check_quota(settings: PoolSettings | None, totals: tuple[int, int, int], ask: PlacementAsk) -> None:
    """Refuse an ask the tenant's quota in the pool does not allow; ``totals`` is ``(count, vcpu, memory_mib)``.

    Raises:
        QuotaExceededError: the ask would pass one of the pool's limits (``details.limit`` names it).
    """
    if settings is None:
        return
    count, vcpu, memory = totals
    for limit, used, wanted, name in (
        (settings.max_instances, count, 1, "max_instances"),
        (settings.max_vcpu, vcpu, ask.vcpu, "max_vcpu"),
        (settings.max_memory_mib, memory, ask.memory_mib, "max_memory_mib"),
    ):
        if limit is not None and used + wanted > limit:
            raise QuotaExceededError(
                f"the tenant's quota in this pool does not allow it ({name})",
                details={"limit": name, "max": limit, "used": used, "asked": wanted},
            )


def provider_instance_type(settings: PoolSettings, size: Size) -> str:
    """The provider pool's instance type for ``size`` (the smallest that fits).

    Raises:
        NoCapacityError: none of the pool's instance types is that large.
    """
    provider = settings.provider or {}
    catalog = {
        str(t["name"]): CatalogType(vcpu=int(t["vcpu"]), memory_mib=int(t["memory_mib"]), gpus=int(t.get("gpus", 0)))
        for t in provider.get("instance_types") or ()
    }
    chosen = pick_instance_type(catalog, vcpu=size.vcpu, memory_mib=size.memory_mib, gpus=size.gpus)
    if chosen is None:
        raise NoCapacityError(
            "none of the provider pool's instance types is that large",
            details={
                "reason": "no_instance_type",
                "size": {"vcpu": size.vcpu, "memory_mib": size.memory_mib, "gpus": size.gpus},
                "instance_types": sorted(catalog),
            },
        )
    return chosen
