"""The ``instances`` methods that change what an instance should be: create, start, stop, reboot, resize, delete.

``instances.create`` is admission on ``compute-instance``: the caller's IAM decision on the tenant and pool comes
first (before any write), then one transaction takes the pool's placement lock, checks the tenant's quota, places
the instance (a node with room on a hosted pool; an instance type that fits at a provider), writes the instance,
its booking, its projection row, the audit row and the event, and hands it on (the node's desired state, or the
provider workflow). Every later operation only changes what the instance should be (``power``, ``boot``, size,
``deleting``) and bumps its ``spec``; its node or its workflow converges to it.
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any

from bettercompute import CallContext, method
from bettercompute.errors import (
    ConflictError,
    FailedPreconditionError,
    InvalidInputError,
    NoCapacityError,
    NotFoundError,
)
from bettercompute.modules.images import IMAGES, ImageRecord
from bettercompute.modules.pools import POOLS
from bettercompute.ports import ResourceRef, Transaction
from bettercompute_vps._hosted import node_item
from bettercompute_vps._lifecycle import (
    HOSTED,
    INSTANCE,
    PROVIDER,
    event,
    finish_delete,
    in_pool,
    on_instance,
    size_of,
)
from bettercompute_vps._placement import check_quota, host_room, no_capacity, place, provider_instance_type
from bettercompute_vps._port import VPS, InstanceRecord, PlacementAsk, PoolSettings, Vps
from bettercompute_vps._provider import compose_user_data
from bettercompute_vps._schemas import CreateInstanceInput, Instance, InstanceInput, ResizeInput
from bettercompute_vps._views import instance_view
from bettercompute_vps._workflows import start_provider

__all__ = ["create", "delete", "reboot", "resize", "start", "stop"]


# --- create -------------------------------------------------------------------------------------------------------


async def _pool_of(call: CallContext, pool_id: str, tenant: str) -> str:
    pool = await call.context.store.repository(POOLS).get(pool_id)
    if pool is None or pool.tenant != tenant:
        raise NotFoundError("no such pool in this tenant", details={"path": "pool_id"})
    if pool.pool_class not in (HOSTED, PROVIDER):
        reason = f"the pool is of class {pool.pool_class}; instances run in 'vps-host' or 'provider' pools"
        raise InvalidInputError(f"pool_id: {reason}", details={"path": "pool_id", "reason": reason})
    return str(pool.pool_class)


async def _disk_image(call: CallContext, image_id: str, tenant: str, path: str = "image_id") -> ImageRecord:
    image = await call.context.store.repository(IMAGES).get(image_id)
    if image is None or image.tenant != tenant:
        raise NotFoundError("no such image in this tenant", details={"path": path})
    if image.kind != "disk":
        raise InvalidInputError(f"{path}: the image is a {image.kind}, not a disk", details={"path": path})
    return image


def _launch_type(input: CreateInstanceInput, image: ImageRecord, settings: PoolSettings, kind: str) -> str:
    """The instance type a provider pool launches the instance as, once what the provider will be given is checked:
    the image has an id there, and the user data is of a kind cloud-init knows and stays within the limit once the
    keys are merged in (refused now with its path, not at the launch)."""
    if kind not in image.provider_images:
        reason = f"the image has no {kind} image id (provider_images)"
        raise InvalidInputError(f"image_id: {reason}", details={"path": "image_id", "reason": reason})
    instance_type = provider_instance_type(settings, input.size)
    compose_user_data(input.user_data, input.ssh_authorized_keys, input.hostname or input.name)
    return instance_type


async def _node_for(
    vps: Vps, pool_id: str, ask: PlacementAsk, settings: PoolSettings | None
) -> tuple[str, tuple[str, ...]]:
    """The node a hosted pool's instance goes to, and the GPUs it takes there (under the pool's placement lock)."""
    hosts = await vps.hosts(pool_id)
    host, excluded = place(hosts, ask, settings)
    if host is None:
        raise no_capacity(ask, hosts, excluded)
    return host.node_id, tuple(sorted(set(host.gpus) - set(host.used_gpus)))[: ask.gpus]


def _new_instance(
    input: CreateInstanceInput,
    *,
    instance_id: str,
    pool_class: str,
    image_id: str,
    placed: tuple[str | None, tuple[str, ...]],
    instance_type: str | None,
    created_by: str,
    now: dt.datetime,
) -> InstanceRecord:
    """The record of an instance just created: ``pending``, to be running, at spec 1."""
    size = input.size
    node_id, gpu_ids = placed
    return InstanceRecord(
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
        vcpu=size.vcpu,
        memory_mib=size.memory_mib,
        disk_gib=size.disk_gib,
        gpus=size.gpus,
        image_id=image_id,
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
        created_by=created_by,
        created_at=now,
        updated_at=now,
        deleted_at=None,
    )


@method(mutates=True, resource=in_pool)
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
    pool_class = await _pool_of(call, input.pool_id, input.tenant)
    image = await _disk_image(call, input.image_id, input.tenant)
    if image.min_disk_gib is not None and input.size.disk_gib < image.min_disk_gib:
        reason = f"the image needs a disk of at least {image.min_disk_gib} GiB"
        raise InvalidInputError(f"size.disk_gib: {reason}", details={"path": "size.disk_gib", "reason": reason})
    settings = await call.context.store.repository(VPS).pool(input.pool_id)
    instance_type = None
    if pool_class == PROVIDER:
        if settings is None or settings.provider is None:
            raise FailedPreconditionError(
                "the provider pool is not configured (vps-pools.configure)", details={"pool_id": input.pool_id}
            )
        instance_type = _launch_type(input, image, settings, str(settings.provider["kind"]))
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
        placed = await _node_for(vps, input.pool_id, ask, settings) if pool_class == HOSTED else (None, ())
        record = await vps.insert_instance(
            _new_instance(
                input,
                instance_id=instance_id,
                pool_class=pool_class,
                image_id=image.id,
                placed=placed,
                instance_type=instance_type,
                created_by=call.identity.principal_id,
                now=now,
            )
        )
        if record is None:
            raise ConflictError("the tenant has a live instance of that name in the pool", details={"path": "name"})
        await vps.open_booking(record, at=now)
        await tx.project(ResourceRef(type=INSTANCE, id=instance_id, tenant=input.tenant, pool=input.pool_id))
        record = await _hand_on(tx, record)
        await tx.publish([event(record, "created", size=size_of(record))])
        call.describe(
            resource_type=INSTANCE,
            resource_id=instance_id,
            tenant=input.tenant,
            details={"pool_id": input.pool_id, "node_id": placed[0], "instance_type": instance_type, **size_of(record)},
        )
    return instance_view(record)


# --- changes of the desired state ---------------------------------------------------------------------------------


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
    if record.pool_class == HOSTED:
        if record.node_id is not None:
            await tx.enqueue([node_item(record.node_id)])
        return record
    return await start_provider(tx, record, reboot=reboot)


@method(mutates=True, resource=on_instance)
async def start(call: CallContext, input: InstanceInput) -> Instance:
    """Power a stopped instance on (its desired power becomes ``running``).

    Raises:
        NotFoundError: no such instance.
        FailedPreconditionError: it is deleted or being deleted.
    """
    return await _change(call, input.id, "start_requested", power="running")


@method(mutates=True, resource=on_instance)
async def stop(call: CallContext, input: InstanceInput) -> Instance:
    """Power an instance off (its desired power becomes ``stopped``); its disk and its place are kept.

    Raises:
        NotFoundError: no such instance.
        FailedPreconditionError: it is deleted or being deleted.
    """
    return await _change(call, input.id, "stop_requested", power="stopped")


@method(mutates=True, resource=on_instance)
async def reboot(call: CallContext, input: InstanceInput) -> Instance:
    """Restart a running instance.

    Raises:
        NotFoundError: no such instance.
        FailedPreconditionError: it is not ``running``, or is being deleted.
    """
    return await _change(call, input.id, "reboot_requested", allowed=frozenset({"running"}), reboot=True)


@method(mutates=True, resource=on_instance)
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
        await tx.publish([event(record, "resize_requested", size=size_of(record))])
        call.describe(resource_type=INSTANCE, resource_id=record.id, tenant=record.tenant, details=size_of(record))
    return instance_view(record)


@method(mutates=True, resource=on_instance)
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
