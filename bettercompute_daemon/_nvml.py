"""GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``), when it is installed and a driver answers.

``read_nvml(pynvml)`` maps what NVML says into the inventory's ``gpus`` section and the health ``diag.nvml``
reports. Each GPU::

    {"index": 0, "uuid": "GPU-...", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "minor": 0,
     "pci_bus_id": "00000000:18:00.0", "serial": "...", "driver_version": "550.54.15",
     "mig": {"current": false, "pending": false},
     "ecc": {"enabled": true, "volatile": {"corrected": 0, "uncorrected": 0},
             "aggregate": {"corrected": 0, "uncorrected": 0}},
     "retired_pages": {"single_bit": 0, "double_bit": 0, "pending": false},
     "remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": false, "failure": false},
     "recovery_action": "none"}

A value NVML does not support on that GPU (retired pages on Ampere and later, row remapping before it, MIG on most
cards, the recovery action before driver 550) is ``null``. XIDs are not counters in NVML, only events to listen to
while running; they are not collected yet, and the health says so (``"xid": null``).

The health, in the fake inventory's shape plus the detail per GPU: ``healthy`` is false when a GPU has uncorrected
volatile ECC errors, pages pending retirement, a row-remapping failure or pending remap, a recovery action other
than ``none``, or could not be read at all.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

__all__ = ["NvmlReading", "read_nvml"]

log = logging.getLogger("bcd")

T = TypeVar("T")
MIB = 1024 * 1024

# NVML_GPU_RECOVERY_ACTION_* (driver 550 and later), by value.
RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}


@attrs.frozen(kw_only=True)
class NvmlReading:
    """What NVML said: the ``gpus`` section, the health, and the claims it adds (model, count, UUIDs)."""

    gpus: list[dict[str, Any]]
    health: dict[str, Any]
    claims: dict[str, Any]


def read_nvml(nvml: Any) -> NvmlReading | None:
    """Read every GPU through ``nvml`` (the ``pynvml`` module); ``None`` when NVML does not start (no driver, no
    library, no permission), so the caller falls back to what it has without it."""
    error: type[BaseException] = nvml.NVMLError
    try:
        nvml.nvmlInit()
    except error as exc:
        log.info("NVML did not start (%s): no GPUs reported", _text(exc))
        return None
    try:
        driver = _optional(error, lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        count = int(nvml.nvmlDeviceGetCount())
        gpus = [_gpu(nvml, error, index, driver) for index in range(count)]
    except error as exc:
        log.warning("NVML failed while listing GPUs (%s): no GPUs reported", _text(exc))
        return None
    finally:
        with contextlib.suppress(error):
            nvml.nvmlShutdown()
    return NvmlReading(gpus=gpus, health=_health(gpus, driver), claims=_claims(gpus))


def _gpu(nvml: Any, error: type[BaseException], index: int, driver: str | None) -> dict[str, Any]:
    """One GPU; ``{"index", "error"}`` when not even its identity can be read."""
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        model = _text(nvml.nvmlDeviceGetName(handle))
        memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
    except error as exc:
        return {"index": index, "error": _text(exc)}

    def ecc_counts(counter: int) -> dict[str, int]:
        return {
            "corrected": int(nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, counter)),
            "uncorrected": int(
                nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter)
            ),
        }

    def ecc() -> dict[str, Any]:
        enabled = nvml.nvmlDeviceGetEccMode(handle)[0] == nvml.NVML_FEATURE_ENABLED
        if not enabled:
            return {"enabled": False, "volatile": None, "aggregate": None}
        return {
            "enabled": True,
            "volatile": ecc_counts(nvml.NVML_VOLATILE_ECC),
            "aggregate": _optional(error, lambda: ecc_counts(nvml.NVML_AGGREGATE_ECC)),
        }

    def mig() -> dict[str, bool]:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
        return {"current": current == nvml.NVML_DEVICE_MIG_ENABLE, "pending": pending == nvml.NVML_DEVICE_MIG_ENABLE}

    def retired_pages() -> dict[str, Any]:
        single = nvml.nvmlDeviceGetRetiredPages(handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
        double = nvml.nvmlDeviceGetRetiredPages(handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle) == nvml.NVML_FEATURE_ENABLED
        return {"single_bit": len(single), "double_bit": len(double), "pending": pending}

    def remapped_rows() -> dict[str, Any]:
        corrected, uncorrected, pending, failure = nvml.nvmlDeviceGetRemappedRows(handle)
        return {
            "corrected": int(corrected),
            "uncorrected": int(uncorrected),
            "pending": bool(pending),
            "failure": bool(failure),
        }

    def recovery_action() -> str | None:
        field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field is None:
            return None
        [value] = nvml.nvmlDeviceGetFieldValues(handle, [field])
        if value.nvmlReturn != nvml.NVML_SUCCESS:
            return None
        return RECOVERY_ACTIONS.get(int(value.value.uiVal), f"unknown_{int(value.value.uiVal)}")

    return {
        "index": index,
        "uuid": uuid,
        "model": model,
        "memory_mib": memory_mib,
        "minor": _optional(error, lambda: int(nvml.nvmlDeviceGetMinorNumber(handle))),
        "pci_bus_id": _optional(error, lambda: _text(nvml.nvmlDeviceGetPciInfo(handle).busId)),
        "serial": _optional(error, lambda: _text(nvml.nvmlDeviceGetSerial(handle))),
        "driver_version": driver,
        "mig": _optional(error, mig),
        "ecc": _optional(error, ecc),
        "retired_pages": _optional(error, retired_pages),
        "remapped_rows": _optional(error, remapped_rows),
        "recovery_action": _optional(error, recovery_action),
    }


def _health(gpus: list[dict[str, Any]], driver: str | None) -> dict[str, Any]:
    detail = []
    for gpu in gpus:
        problems = []
        if "error" in gpu:
            problems.append("unreadable")
        ecc, retired, remapped = gpu.get("ecc") or {}, gpu.get("retired_pages") or {}, gpu.get("remapped_rows") or {}
        uncorrected = (ecc.get("volatile") or {}).get("uncorrected", 0)
        if uncorrected:
            problems.append("ecc_uncorrectable")
        if retired.get("pending"):
            problems.append("retired_pages_pending")
        if remapped.get("failure"):
            problems.append("row_remap_failure")
        if remapped.get("pending"):
            problems.append("row_remap_pending")
        action = gpu.get("recovery_action")
        if action not in (None, "none"):
            problems.append(f"recovery_action_{action}")
        detail.append(
            {
                "index": gpu["index"],
                "uuid": gpu.get("uuid"),
                "ecc_uncorrectable": uncorrected,
                "retired_pages_pending": bool(retired.get("pending")),
                "recovery_action": action,
                "problems": problems,
            }
        )
    return {
        "healthy": not any(d["problems"] for d in detail),
        "source": "nvml",
        "driver_version": driver,
        "ecc_uncorrectable": sum(d["ecc_uncorrectable"] for d in detail),
        "retired_pages_pending": any(d["retired_pages_pending"] for d in detail),
        "xid": None,
        "gpus": detail,
    }


def _claims(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    readable = [g for g in gpus if "uuid" in g]
    models = sorted({g["model"] for g in readable})
    claims: dict[str, Any] = {"gpu_count": len(gpus), "gpu_uuids": [g["uuid"] for g in readable]}
    if len(models) == 1:
        claims["gpu_model"] = models[0]
    return claims


def _optional(error: type[BaseException], read: Callable[[], T]) -> T | None:
    """``read()``, or ``None`` when NVML refuses it (not supported on this GPU, no permission, ...)."""
    try:
        return read()
    except error:
        return None


def _text(value: Any) -> str:
    """NVML's text (``bytes`` from older bindings), printable ASCII only, at most 128 characters."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    text = str(value)
    return "".join(c if c.isascii() and c.isprintable() else "?" for c in text)[:128]
