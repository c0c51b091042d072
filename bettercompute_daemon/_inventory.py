"""What the daemon says about its machine: the hardware claims it joins with, the inventory sections a gateway asks
for, and the health ``diag.nvml`` reports.

A machine without GPUs (a laptop, CI, the simulator) declares its hardware in a fake-inventory file; every section
read from it is sent with ``fake`` set, so nothing downstream mistakes it for the real thing. Its shape::

    {"claims": {"hostname": ..., "serial": ..., "product": ..., "gpu_model": ..., "gpu_count": 8},
     "sections": {"gpus": [{"uuid": ..., "model": ..., "memory_mib": ...}], ...},
     "health": {"healthy": true, "ecc_uncorrectable": 0, "xid": [], "retired_pages_pending": false}}

Without one, claims come from SMBIOS (``/sys/class/dmi/id``); the ``cpu``, ``memory``, ``disks`` and ``nics``
sections from ``/proc`` and ``/sys``; GPUs, their claims (model, count, UUIDs) and the health from NVML when
``nvidia-ml-py`` is installed (``pip install 'bettercompute[daemon,nvml]'``) and a driver answers (``_nvml``).
Without NVML there are no GPUs, and the health says why.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import socket
from pathlib import Path
from typing import Any

import attrs

from ._nvml import XidWatcher, read_nvml

__all__ = ["NOT_DISKS", "Inventory"]

_DMI = Path("/sys/class/dmi/id")


def _dmi(name: str) -> str | None:
    try:
        value = (_DMI / name).read_text().strip()
    except OSError:
        return None
    return value or None


@attrs.frozen(kw_only=True)
class Inventory:
    """The machine as the daemon reports it; ``fake`` when it comes from a declared file."""

    claims: dict[str, Any]
    sections: dict[str, Any]
    health: dict[str, Any]
    fake: bool
    nvml: Any = attrs.field(default=None, repr=False)
    """The ``pynvml`` module when NVML answered at load: ``diag.nvml`` asks it again (``current_health``)."""
    xids: XidWatcher | None = attrs.field(default=None, repr=False)
    """The XIDs of this machine's GPUs, once ``bcd node`` starts listening (``xids.start()``)."""

    def current_health(self) -> dict[str, Any]:
        """The health now: NVML read again when it answered at load (a GPU that failed since shows, and the XIDs
        heard since ``xids.start()``), else as loaded (the fake inventory's declared health, or no NVML)."""
        if self.nvml is None:
            return self.health
        heard = self.xids.seen() if self.xids is not None and self.xids.listening else None
        reading = read_nvml(self.nvml, xids=heard)
        if reading is None:
            return {"healthy": False, "source": "nvml", "error": "NVML no longer answers"}
        return reading.health

    @classmethod
    def load(cls, fake_inventory: Path | None, *, nvml: Any = None) -> Inventory:
        """From the fake-inventory file when one is given, else from this machine (GPUs through ``nvml``, the
        ``pynvml`` module, imported when installed unless one is given).

        Raises:
            ValueError: the file is not a JSON object with a ``claims`` object.
        """
        if fake_inventory is not None:
            declared = json.loads(fake_inventory.read_text())
            if not isinstance(declared, dict) or not isinstance(declared.get("claims"), dict):
                raise ValueError("a fake inventory is a JSON object with a claims object")
            declared_sections = declared.get("sections") or {}
            declared_health = declared.get("health") or {"healthy": True}
            return cls(
                claims=dict(declared["claims"]),
                sections=dict(declared_sections),
                health=dict(declared_health),
                fake=True,
            )
        claims: dict[str, Any] = {
            "hostname": socket.gethostname(),
            "serial": _dmi("product_serial"),
            "system_uuid": _dmi("product_uuid"),
            "product": _dmi("product_name"),
            "vendor": _dmi("sys_vendor"),
        }
        sections: dict[str, Any] = {
            "cpu": cpu_section(),
            "memory": memory_section(),
            "disks": disks_section(),
            "nics": nics_section(),
            "gpus": [],
        }
        health: dict[str, Any] = {"healthy": True, "source": "no NVML on this machine"}
        module = _pynvml() if nvml is None else nvml
        reading = read_nvml(module) if module is not None else None
        if reading is not None:
            sections["gpus"] = reading.gpus
            health = reading.health
            claims.update(reading.claims)
        return cls(
            claims={k: v for k, v in claims.items() if v is not None},
            sections=sections,
            health=health,
            fake=False,
            nvml=module if reading is not None else None,
            xids=XidWatcher(module) if reading is not None else None,
        )


def _pynvml() -> Any:
    """The ``pynvml`` module of ``nvidia-ml-py``, or ``None`` when it is not installed (it is an optional extra)."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def cpu_section(proc: Path = Path("/proc")) -> dict[str, Any]:
    """Logical CPUs, sockets, the model name (``/proc/cpuinfo``) and the architecture."""
    model, sockets = None, set()
    for line in (_read(proc / "cpuinfo") or "").splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and model is None:
            model = value
        elif key == "physical id":
            sockets.add(value)
    return {
        "count": os.cpu_count(),
        "sockets": len(sockets) or None,
        "model": model or platform.processor() or None,
        "architecture": platform.machine(),
    }


def memory_section(proc: Path = Path("/proc")) -> dict[str, Any]:
    """Total memory in bytes (``MemTotal`` of ``/proc/meminfo``, else the page count)."""
    for line in (_read(proc / "meminfo") or "").splitlines():
        key, _, value = line.partition(":")
        number, _, unit = value.strip().partition(" ")
        if key == "MemTotal" and number.isascii() and number.isdigit():
            return {"bytes": int(number) * (1024 if unit.strip() == "kB" else 1)}
    return {"bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")}


# Block devices that are not disks: loop, RAM and compressed-RAM devices, device-mapper and software RAID views.
NOT_DISKS = ("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")


def disks_section(sysfs: Path = Path("/sys")) -> list[dict[str, Any]]:
    """Whole disks (``/sys/block``): name, size in bytes, rotational, removable, model and serial."""
    disks = []
    block = sysfs / "block"
    names = sorted(p.name for p in block.iterdir()) if block.is_dir() else []
    for name in names:
        if name.startswith(NOT_DISKS):
            continue
        device = block / name
        sectors = _read(device / "size")
        disks.append(
            {
                "name": name,
                "bytes": int(sectors) * 512 if sectors and sectors.isdigit() else None,
                "rotational": _read(device / "queue" / "rotational") == "1",
                "removable": _read(device / "removable") == "1",
                "model": _read(device / "device" / "model") or None,
                "serial": _read(device / "device" / "serial") or _read(device / "serial") or None,
            }
        )
    return disks


def nics_section(sysfs: Path = Path("/sys")) -> list[dict[str, Any]]:
    """Network interfaces with a device behind them (``/sys/class/net``, not ``lo`` or virtual ones): name, MAC
    address, MTU, link speed in Mb/s (``null`` when down or unknown) and state."""
    nics = []
    net = sysfs / "class" / "net"
    names = sorted(p.name for p in net.iterdir()) if net.is_dir() else []
    for name in names:
        interface = net / name
        if not (interface / "device").exists():
            continue  # lo, bridges, veths, tunnels: not hardware
        speed = _read(interface / "speed")
        mtu = _read(interface / "mtu")
        nics.append(
            {
                "name": name,
                "mac": _read(interface / "address"),
                "mtu": int(mtu) if mtu and mtu.isdigit() else None,
                "speed_mbps": int(speed) if speed and speed.isdigit() else None,
                "state": _read(interface / "operstate"),
            }
        )
    return nics


def vm_section(
    vm_dir: Path,
    *,
    vcpu: int | None = None,
    memory_mib: int | None = None,
    disk_gib: int | None = None,
    gpus: list[str] | None = None,
    proc: Path = Path("/proc"),
) -> dict[str, Any]:
    """What a node offers to VM instances (the ``vm`` inventory section the control plane places by): its CPUs,
    its memory less 1 GiB kept for the host, the space free where the instances' disks go, and the GPUs it would
    pass through; each one overridden by the node's settings."""
    if vcpu is None:
        vcpu = os.cpu_count() or 1
    if memory_mib is None:
        total = memory_section(proc).get("bytes")
        memory_mib = max(0, int(total) // (1 << 20) - 1024) if isinstance(total, int) else 0
    if disk_gib is None:
        vm_dir.mkdir(parents=True, exist_ok=True)
        found = os.statvfs(vm_dir)
        disk_gib = int(found.f_bavail * found.f_frsize // (1 << 30))
    return {"vcpu": vcpu, "memory_mib": memory_mib, "disk_gib": disk_gib, "gpus": list(gpus or [])}
