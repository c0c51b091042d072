"""The ``instances`` and ``vps-pools`` groups' logic.

``instances.create`` is admission on ``compute-instance``: the caller's IAM decision on the tenant and pool comes
first (before any write), then one transaction takes the pool's placement lock, checks the tenant's quota, places
the instance (a node with room on a hosted pool; an instance type that fits at a provider), writes the instance,
its booking, its projection row, the audit row and the event, and hands it on (the node's desired state, or the
provider workflow). Every later operation only changes what the instance should be (``power``, ``boot``, size,
``deleting``) and bumps its ``spec``; its node or its workflow converges to it.
"""

from __future__ import annotations

import datetime as dt
import math
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from bettercompute import CallContext, method
from bettercompute.errors import (
    AccessDeniedError,
    ComputeError,
    ConflictError,
    FailedPreconditionError,
    InvalidInputError,
    NoCapacityError,
    NotFoundError,
    QuotaExceededError,
)
from bettercompute.modules.images import IMAGES, ImageRecord
from bettercompute.modules.nodes import TunnelOutput, TunnelRecord
from bettercompute.modules.pools import POOLS
from bettercompute.paging import Keyset
from bettercompute.ports import OutboxEvent, ResourceRef, Store, Transaction
from bettercompute_vps._port import VPS, HostRecord, InstanceRecord, PlacementAsk, PoolSettings
from bettercompute_vps._schemas import (
    ConfigureVpsPoolInput,
    Console,
    CreateInstanceInput,
    GetVpsPoolInput,
    Instance,
    InstanceInput,
    InstanceType,
    ListInstancesInput,
    ListInstancesOutput,
    PoolUsage,
    ProviderInput,
    ResizeInput,
    Size,
    TunnelInput,
    Usage,
    UsageInput,
    VpsPool,
)

INSTANCE = "compute-instance"
"""The resource type of an instance (what IAM decides on, and what the audit rows name)."""
VPS_POOL = "pool"
HOSTED, PROVIDER = "vps-host", "provider"
MAX_USAGE_WINDOW = dt.timedelta(days=366)


def _in_pool(input: Any) -> ResourceRef:
    return ResourceRef(type=INSTANCE, tenant=input.tenant, pool=input.pool_id)


def _in_tenant(input: Any) -> ResourceRef:
    return ResourceRef(type=INSTANCE, tenant=input.tenant)


def _on_instance(input: Any) -> ResourceRef:
    return ResourceRef(type=INSTANCE, id=input.id)


def _on_pool(input: Any) -> ResourceRef:
    return ResourceRef(type=VPS_POOL, id=input.pool_id)


# --- views --------------------------------------------------------------------------------------------------------


def instance_view(record: InstanceRecord) -> Instance:
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


def event(record: InstanceRecord, what: str, **extra: Any) -> OutboxEvent:
    """The outbox event ``instance.<what>``."""
    payload: dict[str, Any] = {
        "instance_id": record.id,
        "tenant": record.tenant,
        "pool_id": record.pool_id,
        "state": record.state,
        "node_id": record.node_id,
        "provider_id": record.provider_id,
    }
    payload.update(extra)
    return OutboxEvent(type=f"instance.{what}", key=record.id, payload=payload)


# --- placement ----------------------------------------------------------------------------------------------------


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


# --- checks -------------------------------------------------------------------------------------------------------


async def _pool_of(call: CallContext, pool_id: str, tenant: str) -> str:
    pool = await call.context.store.repository(POOLS).get(pool_id)
    if pool is None or pool.tenant != tenant:
        raise NotFoundError("no such pool in this tenant", details={"path": "pool_id"})
    if pool.pool_class not in (HOSTED, PROVIDER):
        reason = f"the pool is of class {pool.pool_class}; instances run in 'vps-host' or 'provider' pools"
        raise InvalidInputError(f"pool_id: {reason}", details={"path": "pool_id", "reason": reason})
    return str(pool.pool_class)


async def disk_image(call: CallContext, image_id: str, tenant: str, path: str = "image_id") -> ImageRecord:
    image = await call.context.store.repository(IMAGES).get(image_id)
    if image is None or image.tenant != tenant:
        raise NotFoundError("no such image in this tenant", details={"path": path})
    if image.kind != "disk":
        raise InvalidInputError(f"{path}: the image is a {image.kind}, not a disk", details={"path": path})
    return image


def provider_instance_type(settings: PoolSettings, size: Size) -> str:
    from bettercompute_vps._provider import InstanceType as CatalogType
    from bettercompute_vps._provider import pick_instance_type

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


async def existing(call: CallContext, instance_id: str) -> InstanceRecord:
    record = await call.context.store.repository(VPS).get_instance(instance_id)
    if record is None:
        raise NotFoundError("no such instance", details={"id": instance_id})
    return record


# --- create -------------------------------------------------------------------------------------------------------


@method(mutates=True, resource=_in_pool)
async def create(call: CallContext, input: CreateInstanceInput) -> Instance:
    """Create an instance: placed on a node of a ``vps-host`` pool, or launched at the provider of a ``provider``
    pool. It answers ``pending`` (or ``provisioning`` once handed on); ``instances.get`` shows it converge.

    Raises:
        NotFoundError: no such pool or image in the tenant.
        InvalidInputError: the pool is not a VPS pool; the image is not a disk image, needs a larger disk, or has no
            image at the pool's provider.
        FailedPreconditionError: a provider pool that is not configured (``vps-pools.configure``).
        QuotaExceededError: the tenant's quota in the pool does not allow it.
        NoCapacityError: no node has room for the size (``details.excluded`` counts nodes per reason), or no
            instance type of the provider pool is that large.
        ConflictError: the tenant has a live instance of that name in the pool.
    """
    from bettercompute_vps._hosted import node_item
    from bettercompute_vps._workflows import start_provider

    pool_class = await _pool_of(call, input.pool_id, input.tenant)
    image = await disk_image(call, input.image_id, input.tenant)
    if image.min_disk_gib is not None and input.size.disk_gib < image.min_disk_gib:
        reason = f"the image needs a disk of at least {image.min_disk_gib} GiB"
        raise InvalidInputError(f"size.disk_gib: {reason}", details={"path": "size.disk_gib", "reason": reason})
    repository = call.context.store.repository(VPS)
    settings = await repository.pool(input.pool_id)
    instance_type = None
    if pool_class == PROVIDER:
        if settings is None or settings.provider is None:
            raise FailedPreconditionError(
                "the provider pool is not configured (vps-pools.configure)", details={"pool_id": input.pool_id}
            )
        kind = str(settings.provider["kind"])
        if kind not in image.provider_images:
            reason = f"the image has no {kind} image id (provider_images)"
            raise InvalidInputError(f"image_id: {reason}", details={"path": "image_id", "reason": reason})
        instance_type = provider_instance_type(settings, input.size)
        # What the provider will be given is checked now, not at the launch: user data of a kind cloud-init does
        # not know, or that outgrows the limit once the keys are merged in, is refused here with its path.
        from bettercompute_vps._provider import compose_user_data

        compose_user_data(input.user_data, input.ssh_authorized_keys, input.hostname or input.name)
    ask = PlacementAsk(
        vcpu=input.size.vcpu, memory_mib=input.size.memory_mib, disk_gib=input.size.disk_gib, gpus=input.size.gpus
    )
    now = call.context.clock.now()
    instance_id = f"inst_{secrets.token_hex(8)}"
    assert call.identity is not None
    async with call.transaction() as tx:
        vps = tx.repository(VPS)
        await vps.lock_pool(input.pool_id)
        check_quota(settings, await vps.tenant_totals(input.pool_id, input.tenant), ask)
        node_id: str | None = None
        gpu_ids: tuple[str, ...] = ()
        if pool_class == HOSTED:
            hosts = await vps.hosts(input.pool_id)
            host, excluded = place(hosts, ask, settings)
            if host is None:
                raise no_capacity(ask, hosts, excluded)
            node_id = host.node_id
            gpu_ids = tuple(sorted(set(host.gpus) - set(host.used_gpus)))[: ask.gpus]
        record = await vps.insert_instance(
            InstanceRecord(
                id=instance_id,
                tenant=input.tenant,
                pool_id=input.pool_id,
                pool_class=pool_class,
                name=input.name,
                hostname=input.hostname or input.name,
                state="pending",
                step="place" if pool_class == HOSTED else "launch",
                reason=None,
                message=None,
                power="running",
                boot=0,
                spec=1,
                observed_spec=0,
                vcpu=ask.vcpu,
                memory_mib=ask.memory_mib,
                disk_gib=ask.disk_gib,
                gpus=ask.gpus,
                image_id=image.id,
                ssh_keys=input.ssh_authorized_keys,
                user_data=input.user_data,
                ports=input.ports,
                labels=input.labels,
                node_id=node_id,
                gpu_ids=gpu_ids,
                addresses=(),
                console="",
                console_at=None,
                provider_id=None,
                instance_type=instance_type,
                client_token=f"bc-{instance_id}",
                workflow_id=None,
                deleting=False,
                created_by=call.identity.principal_id,
                created_at=now,
                updated_at=now,
                deleted_at=None,
            )
        )
        if record is None:
            raise ConflictError("the tenant has a live instance of that name in the pool", details={"path": "name"})
        await vps.open_booking(record, at=now)
        await tx.project(ResourceRef(type=INSTANCE, id=instance_id, tenant=input.tenant, pool=input.pool_id))
        if pool_class == HOSTED:
            assert node_id is not None
            await tx.enqueue([node_item(node_id)])
        else:
            record = await start_provider(tx, record)
        await tx.publish([event(record, "created", size=_size_of(record))])
        call.describe(
            resource_type=INSTANCE,
            resource_id=instance_id,
            tenant=input.tenant,
            details={"pool_id": input.pool_id, "node_id": node_id, "instance_type": instance_type, **_size_of(record)},
        )
    return instance_view(record)


def _size_of(record: InstanceRecord) -> dict[str, int]:
    return {"vcpu": record.vcpu, "memory_mib": record.memory_mib, "disk_gib": record.disk_gib, "gpus": record.gpus}


# --- reads --------------------------------------------------------------------------------------------------------

_PAGES: Keyset[Instance] = Keyset(dt.datetime, str, key=lambda i: (i.created_at, i.id))


@method(mutates=False, resource=_on_instance)
async def get(call: CallContext, input: InstanceInput) -> Instance:
    """An instance: its state, current step and reason, where it runs and its addresses."""
    return instance_view(await existing(call, input.id))


@method(mutates=False, resource=_in_tenant)
async def list_instances(call: CallContext, input: ListInstancesInput) -> ListInstancesOutput:
    """A page of a tenant's instances (optionally one pool's), oldest first; deleted ones only when asked."""
    scope = call.method.action
    after = _PAGES.after(scope, input.cursor)
    records = await call.context.store.repository(VPS).list_instances(
        input.tenant,
        pool_id=input.pool_id,
        include_deleted=input.include_deleted,
        after=after,
        limit=input.limit + 1,
    )
    instances, next_cursor = _PAGES.page(scope, [instance_view(r) for r in records], input.limit)
    return ListInstancesOutput(instances=instances, next_cursor=next_cursor)


@method(mutates=False, resource=_on_instance)
async def console(call: CallContext, input: InstanceInput) -> Console:
    """The tail of an instance's serial console (hosted pools; a provider pool's instances have none here)."""
    record = await existing(call, input.id)
    return Console(id=record.id, text=record.console, updated_at=record.console_at)


@method(mutates=False, resource=_in_tenant)
async def usage(call: CallContext, input: UsageInput) -> Usage:
    """What the tenant's instances held per pool over ``[start, end)``: vCPU-, memory-GiB-, disk-GiB- and
    GPU-hours, from the instances' bookings (a resize closes one booking and opens the next).

    Raises:
        InvalidInputError: ``end`` is not after ``start``, or the window is longer than 366 days.
    """
    if input.end <= input.start:
        raise InvalidInputError("end: must be after start", details={"path": "end"})
    if input.end - input.start > MAX_USAGE_WINDOW:
        raise InvalidInputError("end: the window is at most 366 days", details={"path": "end"})
    rows = await call.context.store.repository(VPS).usage(
        input.tenant, pool_id=input.pool_id, start=input.start, end=input.end
    )
    return Usage(
        tenant=input.tenant,
        start=input.start,
        end=input.end,
        pools=tuple(PoolUsage(**r) for r in rows),
    )


# --- changes of the desired state -----------------------------------------------------------------------------------


async def _change(
    call: CallContext,
    instance_id: str,
    what: str,
    *,
    allowed: frozenset[str] | None = None,
    reboot: bool = False,
    **fields: Any,
) -> Instance:
    """Lock the instance, check it may change, write ``fields`` with the next ``spec`` and hand the change on."""
    async with call.transaction() as tx:
        vps = tx.repository(VPS)
        record = await vps.get_instance(instance_id, lock=True)
        if record is None:
            raise NotFoundError("no such instance", details={"id": instance_id})
        _changeable(record, allowed)
        if reboot:
            fields["boot"] = record.boot + 1
        record = await vps.update_instance(record.id, spec=record.spec + 1, **fields)
        assert record is not None
        record = await _hand_on(tx, record, reboot=reboot)
        await tx.publish([event(record, what)])
        call.describe(
            resource_type=INSTANCE,
            resource_id=record.id,
            tenant=record.tenant,
            details={k: v for k, v in fields.items() if isinstance(v, str | int | bool)},
        )
    return instance_view(record)


def _changeable(record: InstanceRecord, allowed: frozenset[str] | None) -> None:
    if record.deleted_at is not None or record.deleting:
        raise FailedPreconditionError(
            "the instance is deleted or being deleted", details={"state": record.state, "deleting": record.deleting}
        )
    if allowed is not None and record.state not in allowed:
        raise FailedPreconditionError(
            f"the instance is {record.state}; this needs it {' or '.join(sorted(allowed))}",
            details={"state": record.state, "allowed": sorted(allowed)},
        )


async def _hand_on(tx: Transaction, record: InstanceRecord, *, reboot: bool = False) -> InstanceRecord:
    """Make the instance's executor pick the change up: its node's desired state, or the provider workflow."""
    from bettercompute_vps._hosted import node_item
    from bettercompute_vps._workflows import start_provider

    if record.pool_class == HOSTED:
        if record.node_id is not None:
            await tx.enqueue([node_item(record.node_id)])
        return record
    return await start_provider(tx, record, reboot=reboot)


@method(mutates=True, resource=_on_instance)
async def start(call: CallContext, input: InstanceInput) -> Instance:
    """Power a stopped instance on (its desired power becomes ``running``).

    Raises:
        NotFoundError: no such instance.
        FailedPreconditionError: it is deleted or being deleted.
    """
    return await _change(call, input.id, "start_requested", power="running")


@method(mutates=True, resource=_on_instance)
async def stop(call: CallContext, input: InstanceInput) -> Instance:
    """Power an instance off (its desired power becomes ``stopped``); its disk and its place are kept.

    Raises:
        NotFoundError: no such instance.
        FailedPreconditionError: it is deleted or being deleted.
    """
    return await _change(call, input.id, "stop_requested", power="stopped")


@method(mutates=True, resource=_on_instance)
async def reboot(call: CallContext, input: InstanceInput) -> Instance:
    """Restart a running instance.

    Raises:
        NotFoundError: no such instance.
        FailedPreconditionError: it is not ``running``, or is being deleted.
    """
    return await _change(call, input.id, "reboot_requested", allowed=frozenset({"running"}), reboot=True)


@method(mutates=True, resource=_on_instance)
async def resize(call: CallContext, input: ResizeInput) -> Instance:
    """Give an instance a new size. A disk never shrinks. On a hosted pool the size must fit on its node (placed
    under the pool's lock, as at creation); at a provider, another instance type is chosen.

    Raises:
        NotFoundError: no such instance.
        InvalidInputError: the new disk is smaller than the current one.
        FailedPreconditionError: it is being deleted.
        NoCapacityError: its node has no room for the new size, or no instance type is that large.
        QuotaExceededError: the tenant's quota does not allow the growth.
    """
    from bettercompute_vps._hosted import node_item

    size = input.size
    async with call.transaction() as tx:
        vps = tx.repository(VPS)
        current = await vps.get_instance(input.id)
        if current is None:
            raise NotFoundError("no such instance", details={"id": input.id})
        await vps.lock_pool(current.pool_id)
        record = await vps.get_instance(input.id, lock=True)
        assert record is not None
        _changeable(record, None)
        if size.disk_gib < record.disk_gib:
            reason = f"a disk only grows: it is {record.disk_gib} GiB"
            raise InvalidInputError(f"size.disk_gib: {reason}", details={"path": "size.disk_gib", "reason": reason})
        if size.gpus != record.gpus:
            reason = "the GPU count of an instance does not change; create another instance"
            raise InvalidInputError(f"size.gpus: {reason}", details={"path": "size.gpus", "reason": reason})
        settings = await vps.pool(record.pool_id)
        grow = PlacementAsk(
            vcpu=max(0, size.vcpu - record.vcpu),
            memory_mib=max(0, size.memory_mib - record.memory_mib),
            disk_gib=size.disk_gib - record.disk_gib,
            gpus=0,
        )
        count, vcpu, memory = await vps.tenant_totals(record.pool_id, record.tenant)
        check_quota(settings, (count - 1, vcpu, memory), grow)
        fields: dict[str, Any] = {"vcpu": size.vcpu, "memory_mib": size.memory_mib, "disk_gib": size.disk_gib}
        if record.pool_class == HOSTED:
            host = await vps.host(record.node_id) if record.node_id is not None else None
            if host is None:
                raise FailedPreconditionError("the instance has no node", details={"state": record.state})
            room = host_room(host, settings)
            if room[0] < grow.vcpu or room[1] < grow.memory_mib or room[2] < grow.disk_gib:
                excluded = {
                    n: 1
                    for n, r, w in zip(
                        ("vcpu", "memory", "disk"), room[:3], (grow.vcpu, grow.memory_mib, grow.disk_gib), strict=True
                    )
                    if r < w
                }
                raise NoCapacityError(
                    "the instance's node has no room for the new size",
                    details={"reason": "node_full", "node_id": host.node_id, "excluded": excluded},
                )
        else:
            assert settings is not None
            fields["instance_type"] = provider_instance_type(settings, size)
        now = call.context.clock.now()
        record = await vps.update_instance(record.id, spec=record.spec + 1, **fields)
        assert record is not None
        await vps.close_booking(record.id, at=now)
        await vps.open_booking(record, at=now)
        if record.pool_class == HOSTED and record.node_id is not None:
            await tx.enqueue([node_item(record.node_id)])
        else:
            record = await _hand_on(tx, record)
        await tx.publish([event(record, "resize_requested", size=_size_of(record))])
        call.describe(resource_type=INSTANCE, resource_id=record.id, tenant=record.tenant, details=_size_of(record))
    return instance_view(record)


@method(mutates=True, resource=_on_instance)
async def delete(call: CallContext, input: InstanceInput) -> Instance:
    """Delete an instance: its VM and disk go (or the provider terminates it), then its capacity is free and it is
    ``deleted``. Deleting one that is being deleted (or is gone) answers it as it is.

    Raises:
        NotFoundError: no such instance.
    """
    async with call.transaction() as tx:
        vps = tx.repository(VPS)
        record = await vps.get_instance(input.id, lock=True)
        if record is None:
            raise NotFoundError("no such instance", details={"id": input.id})
        if record.deleting or record.deleted_at is not None:
            return instance_view(record)
        record = await vps.update_instance(record.id, spec=record.spec + 1, deleting=True, step="delete")
        assert record is not None
        if record.pool_class == HOSTED and record.node_id is None:
            record = await finish_delete(tx, record, call.context.clock.now())
        else:
            record = await _hand_on(tx, record)
        await tx.publish([event(record, "delete_requested")])
        call.describe(resource_type=INSTANCE, resource_id=record.id, tenant=record.tenant, details={})
    return instance_view(record)


async def finish_delete(tx: Transaction, record: InstanceRecord, now: dt.datetime) -> InstanceRecord:
    """The instance is gone: ``deleted``, its booking closed, its capacity free."""
    vps = tx.repository(VPS)
    await vps.close_booking(record.id, at=now)
    done = await vps.update_instance(
        record.id, state="deleted", step=None, reason=None, message=None, deleted_at=now, observed_spec=record.spec
    )
    assert done is not None
    await tx.publish([event(done, "deleted")])
    return done


# --- tunnels ------------------------------------------------------------------------------------------------------


@method(mutates=True, resource=_on_instance, replayable=False)
async def tunnel(call: CallContext, input: TunnelInput) -> TunnelOutput:
    """Open a tunnel to one of a running hosted instance's ``ports``, through the gateway holding its node's session
    (``better-compute tunnel <id> --port P --local L``; docs/tunnels.md). The answer holds a one-time ticket; the
    tunnel closes when the instance stops or is deleted, or the caller loses ``compute:instances:tunnel`` on it.

    Raises:
        NotFoundError: no such instance.
        InvalidInputError: the port is not one the instance exposes (``ports``).
        FailedPreconditionError: the instance is not running on a node (a provider pool's instances are reached at
            their provider's addresses).
    """
    from bettercompute import JoinSettings
    from bettercompute.errors import UnauthenticatedError
    from bettercompute.modules.nodes import open_tunnel_in, tunnel_output

    record = await existing(call, input.id)
    if input.port not in record.ports:
        reason = f"the instance exposes ports {list(record.ports)} only"
        raise InvalidInputError(f"port: {reason}", details={"path": "port", "reason": reason})
    if record.pool_class != HOSTED or record.node_id is None:
        raise FailedPreconditionError(
            "only an instance on a node of a vps-host pool is reached through a tunnel",
            details={"pool_class": record.pool_class},
        )
    if record.deleting or record.state != "running" or record.power != "running":
        raise FailedPreconditionError(
            f"the instance is {record.state}; a tunnel needs it running", details={"state": record.state}
        )
    if call.identity is None:  # pragma: no cover - only open methods are called without an identity
        raise UnauthenticatedError("a tunnel is opened by an authenticated caller")
    settings = call.context.settings.get(JoinSettings)
    kms = call.context.kms
    if settings is None or kms is None:
        raise FailedPreconditionError("tunnels need node identity (Options.join) and a KMS")
    async with call.transaction() as tx:
        ticket = await open_tunnel_in(
            tx,
            tenant=record.tenant,
            identity=call.identity,
            node_id=record.node_id,
            host=f"instance:{record.id}",
            port=input.port,
            resource=ResourceRef(type=INSTANCE, id=record.id),
            action=call.method.action,
            now=call.context.clock.now(),
        )
        call.describe(
            resource_type=INSTANCE,
            resource_id=record.id,
            tenant=record.tenant,
            details={"event": "tunnel_opened", "tunnel_id": ticket.tunnel_id, "port": input.port},
        )
    return await tunnel_output(call, ticket)


async def instance_tunnel_check(store: Store, tunnel: TunnelRecord, now: dt.datetime) -> str | None:
    """Tunnels to an instance close when it no longer runs: stopped, being deleted, failed, or gone."""
    record = await store.repository(VPS).get_instance(tunnel.resource_id)
    if record is None or record.deleted_at is not None or record.deleting:
        return "instance_deleted"
    if record.power != "running" or record.state not in ("running", "provisioning"):
        return "instance_stopped"
    return None


# --- vps-pools ----------------------------------------------------------------------------------------------------


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
    from bettercompute.modules.secrets import SECRETS

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
