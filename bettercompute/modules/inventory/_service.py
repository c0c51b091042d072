"""The ``devices`` group: the GPUs, NICs and disks of a tenant's nodes, with the atoms each GPU makes.

Devices are decided on their node: ``list`` names the tenant (and optionally a node), ``get`` names the node and the
device, so the node's projection (its tenant and pool) decides who may see them, as for ``nodes``.
"""

from __future__ import annotations

from typing import Any

from bettercompute._runtime.registry import CallContext, method
from bettercompute.errors import NotFoundError
from bettercompute.modules.inventory._port import INVENTORY, AtomRecord, DeviceRecord
from bettercompute.modules.inventory._schemas import Atom, Device, GetDeviceInput, ListDevicesInput, ListDevicesOutput
from bettercompute.modules.nodes import NODE
from bettercompute.paging import Keyset
from bettercompute.ports import ResourceRef

__all__ = ["get_device", "list_devices"]


def _atom(record: AtomRecord) -> Atom:
    return Atom(
        id=record.id,
        kind=record.kind,
        ident=record.ident,
        model=record.model,
        profile=record.profile,
        memory_mib=record.memory_mib,
        state=record.state,
        reason=record.reason,
    )


def _device(record: DeviceRecord, atoms: list[AtomRecord]) -> Device:
    return Device(
        id=record.id,
        node_id=record.node_id,
        tenant=record.tenant,
        pool_id=record.pool_id,
        kind=record.kind,
        ident=record.ident,
        slot=record.slot,
        model=record.model,
        details=dict(record.details),
        state=record.state,
        first_seen_at=record.first_seen_at,
        missing_since=record.missing_since,
        atoms=tuple(_atom(a) for a in atoms if a.device_id == record.id),
    )


_PAGES: Keyset[Device] = Keyset(str, str, str, key=lambda d: (d.node_id, d.kind, d.ident))


def _tenant(input: Any) -> ResourceRef:
    # Decided on the tenant; ``node_id`` only filters (within the tenant), so another tenant's node lists nothing,
    # exactly as an unknown one does.
    return ResourceRef(type=NODE, tenant=input.tenant)


def _node(input: Any) -> ResourceRef:
    return ResourceRef(type=NODE, id=input.node_id)


@method(mutates=False, resource=_tenant)
async def list_devices(call: CallContext, input: ListDevicesInput) -> ListDevicesOutput:
    """A page of a tenant's devices (of one node, of one kind).

    Raises:
        InvalidInputError: the cursor is not one this list returned.
    """
    scope = call.method.action
    after = _PAGES.after(scope, input.cursor)
    inventory = call.context.store.repository(INVENTORY)
    found = await inventory.devices_page(
        input.tenant, node_id=input.node_id, kind=input.kind, after=after, limit=input.limit + 1
    )
    atoms = await inventory.atoms_of_devices([d.id for d in found if d.kind == "gpu"])
    devices, next_cursor = _PAGES.page(scope, [_device(d, atoms) for d in found], input.limit)
    return ListDevicesOutput(devices=devices, next_cursor=next_cursor)


@method(mutates=False, resource=_node)
async def get_device(call: CallContext, input: GetDeviceInput) -> Device:
    """A device of a node, with its atoms.

    Raises:
        NotFoundError: the node has no such device. The answer is the one an unknown node gets (``no such node``,
            the node's id), so that it never tells a caller allowed to ask whether a node of another tenant exists.
    """
    inventory = call.context.store.repository(INVENTORY)
    record = await inventory.device(input.id)
    if record is None or record.node_id != input.node_id:
        raise NotFoundError("no such node", details={"id": input.node_id})
    return _device(record, await inventory.atoms_of_devices([record.id]))
