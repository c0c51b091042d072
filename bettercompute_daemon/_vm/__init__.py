"""``bcd node``'s VM runtime: the ``instances`` of a hosted (``vps-host``) pool's node run as QEMU VMs
(``docs/vps-node.md``)."""

from bettercompute_daemon._vm._host import CONSOLE_BYTES as CONSOLE_BYTES
from bettercompute_daemon._vm._host import Report as Report
from bettercompute_daemon._vm._host import VmHost as VmHost
from bettercompute_daemon._vm._network import Addresses as Addresses
from bettercompute_daemon._vm._network import bridge_name as bridge_name
from bettercompute_daemon._vm._qemu import QemuOptions as QemuOptions
from bettercompute_daemon._vm._qemu import QemuRuntime as QemuRuntime
from bettercompute_daemon._vm._runtime import REASONS as REASONS
from bettercompute_daemon._vm._runtime import InstanceState as InstanceState
from bettercompute_daemon._vm._runtime import InstanceStatus as InstanceStatus
from bettercompute_daemon._vm._runtime import VmRuntime as VmRuntime
from bettercompute_daemon._vm._seed import build_seed_iso as build_seed_iso
from bettercompute_daemon._vm._seed import seed_files as seed_files
from bettercompute_daemon._vm._spec import ImageFile as ImageFile
from bettercompute_daemon._vm._spec import ImageSpec as ImageSpec
from bettercompute_daemon._vm._spec import InstanceSpec as InstanceSpec
from bettercompute_daemon._vm._spec import SpecError as SpecError
from bettercompute_daemon._vm._spec import parse_instance as parse_instance
from bettercompute_daemon._vm._spec import parse_instances as parse_instances

__all__ = [
    "CONSOLE_BYTES",
    "REASONS",
    "Addresses",
    "ImageFile",
    "ImageSpec",
    "InstanceSpec",
    "InstanceState",
    "InstanceStatus",
    "QemuOptions",
    "QemuRuntime",
    "Report",
    "SpecError",
    "VmHost",
    "VmRuntime",
    "bridge_name",
    "build_seed_iso",
    "parse_instance",
    "parse_instances",
    "seed_files",
]
