"""The ``devices`` group: the GPUs, NICs and disks of a tenant's nodes, with the atoms each GPU makes.

Devices are decided on their node: ``list`` names the tenant (and optionally a node), ``get`` names the node and the
device, so the node's projection (its tenant and pool) decides who may see them, as for ``nodes``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, TypeVar

import attrs

from bettercompute._runtime.registry import CallContext, GroupSpec, method
from bettercompute.errors import NotFoundError
from bettercompute.fields import Text
from bettercompute.modules.inventory._port import INVENTORY, AtomRecord, DeviceRecord
from bettercompute.paging import Keyset, PageInput
from bettercompute.ports import ResourceRef

__all__ = ["ACTIONS", "Atom", "Device", "DevicesGroup", "GetDeviceInput", "ListDevicesInput", "ListDevicesOutput"]

NODE = "node"
DeviceKind = Literal["gpu", "nic", "disk"]
_ID = Text(pattern=r"[A-Za-z0-9._-]{1,128}", reason="must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'")
B = TypeVar("B")


@attrs.frozen(kw_only=True)
class ListDevicesInput(PageInput):
    """A tenant's devices, of one node and of one kind when given, one page at a time."""

    tenant: str = attrs.field(validator=_ID)
    node_id: str | None = attrs.field(default=None, validator=_ID)
    kind: DeviceKind | None = None


@attrs.frozen(kw_only=True)
class GetDeviceInput:
    """A device of a node."""

    node_id: str = attrs.field(validator=_ID)
    id: str = attrs.field(validator=_ID)


@attrs.frozen(kw_only=True)
class Atom:
    """A unit of capacity: a whole GPU or a MIG slice, ``available`` or ``unavailable`` with a reason."""

    id: str
    kind: str
    ident: str
    model: str | None
    profile: str | None
    memory_mib: int | None
    state: str
    reason: str | None


@attrs.frozen(kw_only=True)
class Device:
    """A GPU, NIC or disk of a node: ``present``, ``missing`` (no longer reported, kept with what was on it) or
    ``conflict`` (a GPU UUID another node holds). ``details`` are what the daemon reported (for a GPU: memory, MIG
    mode and slices, NVLink peers, driver)."""

    id: str
    node_id: str
    tenant: str
    pool_id: str
    kind: str
    ident: str
    slot: str | None
    model: str | None
    details: dict[str, Any]
    state: str
    first_seen_at: dt.datetime | None
    missing_since: dt.datetime | None
    atoms: tuple[Atom, ...]


@attrs.frozen(kw_only=True)
class ListDevicesOutput:
    """A page of devices by node, kind and identity; ``next_cursor`` is null on the last page."""

    devices: tuple[Device, ...]
    next_cursor: str | None


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


class DevicesGroup(GroupSpec[B]):
    """The devices of joined machines and the atoms they make."""

    name = "devices"
    list = list_devices
    get = get_device


ACTIONS = tuple(sorted(m.action for m in DevicesGroup.methods.values()))
