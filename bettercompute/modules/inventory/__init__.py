"""Inventory and the node lifecycle: devices, conditions and atoms derived from what daemons report, acceptance
checks, quarantine and reachability (the built-in node controllers), and the ``devices`` group."""

from bettercompute.modules.inventory._checks import DIAG_NVML, AcceptanceCheck, Finding, judge_nvml
from bettercompute.modules.inventory._controllers import NODE_ADOPTED, NODE_QUARANTINED, NODE_STATE_CHANGED
from bettercompute.modules.inventory._derive import CONDITION_TYPES
from bettercompute.modules.inventory._devices import (
    Atom,
    Device,
    DevicesGroup,
    GetDeviceInput,
    ListDevicesInput,
    ListDevicesOutput,
)
from bettercompute.modules.inventory._module import InventoryModule
from bettercompute.modules.inventory._port import (
    INVENTORY,
    AtomRecord,
    ConditionRecord,
    DeviceRecord,
    Inventory,
)

__all__ = [
    "CONDITION_TYPES",
    "DIAG_NVML",
    "INVENTORY",
    "NODE_ADOPTED",
    "NODE_QUARANTINED",
    "NODE_STATE_CHANGED",
    "AcceptanceCheck",
    "Atom",
    "AtomRecord",
    "ConditionRecord",
    "Device",
    "DeviceRecord",
    "DevicesGroup",
    "Finding",
    "GetDeviceInput",
    "Inventory",
    "InventoryModule",
    "ListDevicesInput",
    "ListDevicesOutput",
    "judge_nvml",
]
