"""Inventory and the node lifecycle: devices, conditions and atoms derived from what daemons report, acceptance
checks, quarantine and reachability (the built-in node controllers), and the ``devices`` group."""

from bettercompute.modules.inventory._checks import DIAG_NVML as DIAG_NVML
from bettercompute.modules.inventory._checks import AcceptanceCheck as AcceptanceCheck
from bettercompute.modules.inventory._checks import Finding as Finding
from bettercompute.modules.inventory._checks import judge_nvml as judge_nvml
from bettercompute.modules.inventory._controllers import NODE_ADOPTED as NODE_ADOPTED
from bettercompute.modules.inventory._controllers import NODE_QUARANTINED as NODE_QUARANTINED
from bettercompute.modules.inventory._controllers import NODE_STATE_CHANGED as NODE_STATE_CHANGED
from bettercompute.modules.inventory._derive import CONDITION_TYPES as CONDITION_TYPES
from bettercompute.modules.inventory._facts import FactVerdict as FactVerdict
from bettercompute.modules.inventory._facts import verify_facts as verify_facts
from bettercompute.modules.inventory._methods import ACTIONS as ACTIONS
from bettercompute.modules.inventory._methods import DevicesGroup as DevicesGroup
from bettercompute.modules.inventory._module import InventoryModule as InventoryModule
from bettercompute.modules.inventory._port import INVENTORY as INVENTORY
from bettercompute.modules.inventory._port import AtomRecord as AtomRecord
from bettercompute.modules.inventory._port import DeviceRecord as DeviceRecord
from bettercompute.modules.inventory._port import GpuOwner as GpuOwner
from bettercompute.modules.inventory._port import Inventory as Inventory
from bettercompute.modules.inventory._schemas import Atom as Atom
from bettercompute.modules.inventory._schemas import Device as Device
from bettercompute.modules.inventory._schemas import DeviceKind as DeviceKind
from bettercompute.modules.inventory._schemas import GetDeviceInput as GetDeviceInput
from bettercompute.modules.inventory._schemas import ListDevicesInput as ListDevicesInput
from bettercompute.modules.inventory._schemas import ListDevicesOutput as ListDevicesOutput

__all__ = [
    "ACTIONS",
    "CONDITION_TYPES",
    "DIAG_NVML",
    "INVENTORY",
    "NODE_ADOPTED",
    "NODE_QUARANTINED",
    "NODE_STATE_CHANGED",
    "AcceptanceCheck",
    "Atom",
    "AtomRecord",
    "Device",
    "DeviceKind",
    "DeviceRecord",
    "DevicesGroup",
    "FactVerdict",
    "Finding",
    "GetDeviceInput",
    "GpuOwner",
    "Inventory",
    "InventoryModule",
    "ListDevicesInput",
    "ListDevicesOutput",
    "judge_nvml",
    "verify_facts",
]
