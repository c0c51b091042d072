"""What the inventory controller keeps: devices and atoms (``INVENTORY``). A node's conditions are the node's own
(``bettercompute.modules.nodes.Nodes``).

Their tables hang off ``nodes`` and were made by the ``nodes`` module's migrations (its versions 1 to 8); later
changes to them are this module's migrations.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import attrs

from bettercompute.ports import Repository

__all__ = ["INVENTORY", "AtomRecord", "DeviceRecord", "Inventory"]


@attrs.frozen(kw_only=True)
class GpuOwner:
    """The live node that holds a GPU UUID as ``present``. ``node_id`` is for the control plane's own use: it is shown
    to a tenant only when ``same_tenant``. ``attested``: that node's attestation names the UUID."""

    node_id: str
    same_tenant: bool
    attested: bool


@attrs.frozen(kw_only=True)
class DeviceRecord:
    """A device of a node: ``kind`` ``gpu``, ``nic`` or ``disk``; ``ident`` its stable identity (a GPU's UUID, a NIC's
    MAC address, a disk's serial or name); ``slot`` where it sits (a GPU's index, an interface or block device
    name). ``state``: ``present``; ``missing`` (reported before, not any more: kept, never deleted); ``conflict`` (a
    GPU whose UUID another live node reports: it gives no capacity)."""

    id: str
    node_id: str
    tenant: str
    pool_id: str
    kind: str
    ident: str
    slot: str | None
    model: str | None
    details: Mapping[str, Any]
    state: str
    first_seen_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    missing_since: dt.datetime | None = None


@attrs.frozen(kw_only=True)
class AtomRecord:
    """A unit of capacity: a whole GPU (``kind`` ``gpu``) or a MIG slice (``mig``, ``profile`` like ``1g.10gb``),
    ``ident`` its UUID. ``state`` ``available`` or ``unavailable`` with a ``reason`` (``node_adopting``,
    ``node_quarantined``, ``node_unreachable``, ``device_missing``, ``device_conflict``, ``mig_enabled``, ...)."""

    id: str
    node_id: str
    device_id: str
    tenant: str
    pool_id: str
    kind: str
    ident: str
    model: str | None
    profile: str | None
    memory_mib: int | None
    state: str
    reason: str | None
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None


class Inventory(Protocol):
    """Devices and atoms. The ``save_*`` writes need a transaction (``tx.repository(INVENTORY)``)."""

    async def devices(self, node_id: str) -> list[DeviceRecord]:
        """The node's devices (missing ones included), by kind and ident."""
        ...

    async def device(self, id: str) -> DeviceRecord | None:
        """A device by id."""
        ...

    async def devices_page(
        self, tenant: str, *, node_id: str | None, kind: str | None, after: Sequence[Any] | None, limit: int
    ) -> list[DeviceRecord]:
        """The tenant's devices (of one node, of one kind) in ``(node_id, kind, ident)`` order, after ``after``."""
        ...

    async def gpu_owners(self, idents: Sequence[str], *, besides: str, tenant: str) -> dict[str, GpuOwner]:
        """Of these GPU UUIDs, those present on another live node than ``besides``: UUID -> who holds it."""
        ...

    async def displace(self, held: Sequence[tuple[str, str, Mapping[str, Any]]]) -> int:
        """Put these present GPUs (node id, UUID, details to add) in ``conflict``: a node whose attestation names
        the UUID took it. Needs a transaction; how many moved."""
        ...

    async def release_retired(self, idents: Sequence[str]) -> int:
        """Mark ``missing`` the present GPUs with these UUIDs on retired nodes (their hardware joined again as a new
        node), so the new node can hold them. Needs a transaction; returns how many were released."""
        ...

    async def save_devices(self, devices: Sequence[DeviceRecord]) -> None:
        """Insert or update these devices (by node, kind and ident), in one statement; ``missing_since`` is kept from
        the row when a device stays missing."""
        ...

    async def atoms(self, node_id: str) -> list[AtomRecord]:
        """The node's atoms, by ident."""
        ...

    async def atoms_of_devices(self, device_ids: Sequence[str]) -> list[AtomRecord]:
        """The atoms of these devices, by device and ident."""
        ...

    async def save_atoms(self, atoms: Sequence[AtomRecord]) -> None:
        """Insert or update these atoms (by node and ident), in one statement."""
        ...


INVENTORY: Repository[Inventory] = Repository(module="inventory", name="inventory")
"""``tx.repository(INVENTORY)`` in a transaction, ``store.repository(INVENTORY)`` outside one: the store's
``Inventory``"""
