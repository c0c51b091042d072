"""What the daemon says about its machine: the hardware claims it joins with, the inventory sections a gateway asks
for, and the health ``diag.nvml`` reports.

A machine without GPUs (a laptop, CI, the simulator) declares its hardware in a fake-inventory file; every section
read from it is sent with ``fake`` set, so nothing downstream mistakes it for the real thing. Its shape::

    {"claims": {"hostname": ..., "serial": ..., "product": ..., "gpu_model": ..., "gpu_count": 8},
     "sections": {"gpus": [{"uuid": ..., "model": ..., "memory_mib": ...}], ...},
     "health": {"healthy": true, "ecc_uncorrectable": 0, "xid": [], "retired_pages_pending": false}}

Without one, claims come from SMBIOS (``/sys/class/dmi/id``) and sections from the operating system; GPUs would
come from NVML (``nvidia-ml-py``), which is not installed here, so a machine without the file reports none.
"""

from __future__ import annotations

import json
import os
import platform
import socket
from pathlib import Path
from typing import Any

import attrs

__all__ = ["Inventory"]

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

    @classmethod
    def load(cls, fake_inventory: Path | None) -> Inventory:
        """From the fake-inventory file when one is given, else from this machine.

        Raises:
            ValueError: the file is not a JSON object with a ``claims`` object.
        """
        if fake_inventory is not None:
            declared = json.loads(fake_inventory.read_text())
            if not isinstance(declared, dict) or not isinstance(declared.get("claims"), dict):
                raise ValueError("a fake inventory is a JSON object with a claims object")
            sections = declared.get("sections") or {}
            health = declared.get("health") or {"healthy": True}
            return cls(claims=dict(declared["claims"]), sections=dict(sections), health=dict(health), fake=True)
        claims = {
            "hostname": socket.gethostname(),
            "serial": _dmi("product_serial"),
            "system_uuid": _dmi("product_uuid"),
            "product": _dmi("product_name"),
            "vendor": _dmi("sys_vendor"),
        }
        sections = {
            "cpu": {"count": os.cpu_count(), "model": platform.processor() or platform.machine()},
            "memory": {"bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
            "gpus": [],
        }
        return cls(
            claims={k: v for k, v in claims.items() if v is not None},
            sections=sections,
            health={"healthy": True, "source": "no NVML on this machine"},
            fake=False,
        )
