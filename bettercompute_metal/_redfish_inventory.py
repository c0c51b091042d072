"""What a BMC says its (first) computer system is: the inventory records, and reading them from its resources.

Every resource is read through the client's GETs, so each link followed is a checked path on the BMC's own origin,
and each collection is read up to ``MAX_MEMBERS`` members. A collection the system links to but the BMC does not
implement (404 or 501) reads as empty.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from bettercompute_metal._redfish_json import (
    MAX_MEMBERS,
    bad_response,
    integer_field,
    json_object,
    link,
    mac_address,
    members,
    number_field,
    optional_object,
    safe_path,
    text_field,
    texts_field,
)

__all__ = ["BmcBoot", "BmcDisk", "BmcInventory", "BmcNic", "Get", "InventoryReader"]

Get = Callable[[str], Awaitable[Any]]
"""A GET of a path on the BMC, answering its JSON body."""


def _to_json(instance: Any) -> dict[str, Any]:
    result: dict[str, Any] = attrs.asdict(instance, value_serializer=_list_tuples)
    return result


def _list_tuples(instance: Any, field: Any, value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@attrs.frozen
class BmcNic:
    """A network interface as the BMC lists it; ``mac`` is lowercase with colons, or None when it reports none."""

    id: str
    mac: str | None
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values."""
        return _to_json(self)


@attrs.frozen
class BmcDisk:
    """A drive (``Storage``'s ``Drives``) or a device of ``SimpleStorage``; ``size_bytes`` None when not reported."""

    id: str
    name: str | None
    size_bytes: int | None
    media_type: str | None = None
    protocol: str | None = None
    model: str | None = None
    serial_number: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values."""
        return _to_json(self)


@attrs.frozen
class BmcBoot:
    """The system's boot settings: the override in place, its frequency, the firmware mode and what may be chosen."""

    override_target: str | None
    override_enabled: str | None
    mode: str | None
    allowed_targets: tuple[str, ...] = ()
    boot_order: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values."""
        return _to_json(self)


@attrs.frozen
class BmcInventory:
    """What the BMC says about its (first) computer system. Anything it does not report is None or empty.

    ``system_path`` is the Redfish path of the system (``/redfish/v1/Systems/<id>``); ``cpu_count`` the number of
    processors (sockets), ``cpu_cores`` their cores summed when the ``Processors`` collection reports them;
    ``memory_gib`` is ``MemorySummary.TotalSystemMemoryGiB``.
    """

    system_path: str
    uuid: str | None
    name: str | None
    serial_number: str | None
    manufacturer: str | None
    model: str | None
    power_state: str | None
    cpu_count: int | None
    cpu_cores: int | None
    cpu_model: str | None
    memory_gib: float | None
    nics: tuple[BmcNic, ...]
    disks: tuple[BmcDisk, ...]
    boot: BmcBoot

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (tuples become lists)."""
        return _to_json(self)


class InventoryReader:
    """Reads a system's inventory through a client's GETs.

    Args:
        get: A GET of a path, raising ``RedfishError`` on any failure.
        get_optional: The same, answering ``None`` for a resource the BMC does not have (404 or 501).
    """

    def __init__(self, get: Get, get_optional: Get) -> None:
        self._get = get
        self._get_optional = get_optional

    async def read(self, path: str) -> BmcInventory:
        """The inventory of the system at ``path``: its identity, power state, processors, memory, NICs, disks and
        boot settings (the ``Processors``, ``EthernetInterfaces`` and storage collections are read when linked)."""
        system = json_object(await self._get(path), "system")
        what = "system"
        processors = optional_object(system, "ProcessorSummary", what)
        memory = optional_object(system, "MemorySummary", what)
        cpu_count = integer_field(processors, "Count", "ProcessorSummary")
        cpu_model = text_field(processors, "Model", "ProcessorSummary")
        cpu_cores: int | None = None
        processors_path = link(system, "Processors", what)
        if processors_path is not None:
            listed = await self._processors(processors_path)
            if listed:
                cpu_count = len(listed) if cpu_count is None else cpu_count
                cpu_model = cpu_model or next((model for model, _ in listed if model), None)
                cores = [count for _, count in listed if count is not None]
                cpu_cores = sum(cores) if cores else None
        nics_path = link(system, "EthernetInterfaces", what)
        nics = await self._nics(nics_path) if nics_path is not None else ()
        disks: tuple[BmcDisk, ...] = ()
        storage_path = link(system, "Storage", what)
        if storage_path is not None:
            disks = await self._storage_drives(storage_path)
        simple_path = link(system, "SimpleStorage", what)
        if not disks and simple_path is not None:
            disks = await self._simple_storage(simple_path)
        boot = optional_object(system, "Boot", what)
        return BmcInventory(
            system_path=path,
            uuid=text_field(system, "UUID", what),
            name=text_field(system, "Name", what),
            serial_number=text_field(system, "SerialNumber", what),
            manufacturer=text_field(system, "Manufacturer", what),
            model=text_field(system, "Model", what),
            power_state=text_field(system, "PowerState", what),
            cpu_count=cpu_count,
            cpu_cores=cpu_cores,
            cpu_model=cpu_model,
            memory_gib=number_field(memory, "TotalSystemMemoryGiB", "MemorySummary"),
            nics=nics,
            disks=disks,
            boot=BmcBoot(
                override_target=text_field(boot, "BootSourceOverrideTarget", "Boot"),
                override_enabled=text_field(boot, "BootSourceOverrideEnabled", "Boot"),
                mode=text_field(boot, "BootSourceOverrideMode", "Boot"),
                allowed_targets=texts_field(boot, "BootSourceOverrideTarget@Redfish.AllowableValues", "Boot"),
                boot_order=texts_field(boot, "BootOrder", "Boot"),
            ),
        )

    async def _processors(self, path: str) -> list[tuple[str | None, int | None]]:
        collection = await self._get_optional(path)
        if collection is None:
            return []
        found: list[tuple[str | None, int | None]] = []
        for member in members(json_object(collection, "processors collection"), "processors"):
            processor = json_object(await self._get(member), "processor")
            kind = text_field(processor, "ProcessorType", "processor")
            if kind not in (None, "CPU"):
                continue  # GPUs, FPGAs and accelerators are the node agent's to report, not the BMC's CPU count.
            found.append(
                (text_field(processor, "Model", "processor"), integer_field(processor, "TotalCores", "processor"))
            )
        return found

    async def _nics(self, path: str) -> tuple[BmcNic, ...]:
        collection = await self._get_optional(path)
        if collection is None:
            return ()
        nics: list[BmcNic] = []
        for member in members(json_object(collection, "EthernetInterfaces collection"), "EthernetInterfaces"):
            nic = json_object(await self._get(member), "EthernetInterface")
            mac = mac_address(text_field(nic, "MACAddress", "EthernetInterface")) or mac_address(
                text_field(nic, "PermanentMACAddress", "EthernetInterface")
            )
            nics.append(
                BmcNic(
                    id=text_field(nic, "Id", "EthernetInterface") or member.rsplit("/", 1)[-1],
                    mac=mac,
                    name=text_field(nic, "Name", "EthernetInterface"),
                )
            )
        return tuple(nics)

    async def _storage_drives(self, path: str) -> tuple[BmcDisk, ...]:
        collection = await self._get_optional(path)
        if collection is None:
            return ()
        disks: list[BmcDisk] = []
        for member in members(json_object(collection, "Storage collection"), "Storage"):
            storage = json_object(await self._get(member), "Storage")
            links = storage.get("Drives") or []
            if not isinstance(links, list):
                raise bad_response("The BMC's Storage has Drives that is not a list.")
            for drive_link in links[:MAX_MEMBERS]:
                drive_path = safe_path(json_object(drive_link, "Drives link").get("@odata.id"), "Drive")
                drive = json_object(await self._get(drive_path), "Drive")
                disks.append(
                    BmcDisk(
                        id=text_field(drive, "Id", "Drive") or drive_path.rsplit("/", 1)[-1],
                        name=text_field(drive, "Name", "Drive"),
                        size_bytes=integer_field(drive, "CapacityBytes", "Drive"),
                        media_type=text_field(drive, "MediaType", "Drive"),
                        protocol=text_field(drive, "Protocol", "Drive"),
                        model=text_field(drive, "Model", "Drive"),
                        serial_number=text_field(drive, "SerialNumber", "Drive"),
                    )
                )
        return tuple(disks)

    async def _simple_storage(self, path: str) -> tuple[BmcDisk, ...]:
        collection = await self._get_optional(path)
        if collection is None:
            return ()
        disks: list[BmcDisk] = []
        for member in members(json_object(collection, "SimpleStorage collection"), "SimpleStorage"):
            controller = json_object(await self._get(member), "SimpleStorage")
            devices = controller.get("Devices") or []
            if not isinstance(devices, list):
                raise bad_response("The BMC's SimpleStorage has Devices that is not a list.")
            controller_id = text_field(controller, "Id", "SimpleStorage") or member.rsplit("/", 1)[-1]
            for index, device_value in enumerate(devices[:MAX_MEMBERS]):
                device = json_object(device_value, "SimpleStorage device")
                status = optional_object(device, "Status", "SimpleStorage device")
                if text_field(status, "State", "SimpleStorage device Status") == "Absent":
                    continue
                disks.append(
                    BmcDisk(
                        id=f"{controller_id}/{index}",
                        name=text_field(device, "Name", "SimpleStorage device"),
                        size_bytes=integer_field(device, "CapacityBytes", "SimpleStorage device"),
                        model=text_field(device, "Model", "SimpleStorage device"),
                    )
                )
        return tuple(disks)
