"""GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``), when it is installed and a driver answers.

``read_nvml(pynvml)`` maps what NVML says into the inventory's ``gpus`` section and the health ``diag.nvml``
reports. Each GPU::

    {"index": 0, "uuid": "GPU-...", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "minor": 0,
     "pci_bus_id": "00000000:18:00.0", "serial": "...", "driver_version": "550.54.15",
     "mig": {"current": false, "pending": false},
     "nvlink_peers": ["GPU-...", ...],
     "ecc": {"enabled": true, "volatile": {"corrected": 0, "uncorrected": 0},
             "aggregate": {"corrected": 0, "uncorrected": 0}},
     "retired_pages": {"single_bit": 0, "double_bit": 0, "pending": false},
     "remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": false, "failure": false},
     "recovery_action": "none"}

A value NVML does not support on that GPU (retired pages on Ampere and later, row remapping before it, MIG on most
cards, the recovery action before driver 550, peer-to-peer status) is ``null``. With MIG on, ``mig`` also lists the
MIG devices: ``"devices": [{"uuid": "MIG-...", "profile": "1g.10gb", "memory_mib": 9856}]`` (the profile read from
the device's name, ``null`` when it does not say). ``nvlink_peers`` are the UUIDs of the other GPUs this one reaches
peer-to-peer over NVLink (directly or through NVSwitch).

XIDs are not counters in NVML but events: ``XidWatcher`` listens for them in a thread while ``bcd node`` runs and
keeps the last ones (``"xid": [{"uuid", "xid", "at_ms"}]`` in the health; ``null`` when nothing listens).

The health, in the fake inventory's shape plus the detail per GPU: ``healthy`` is false when a GPU has uncorrected
volatile ECC errors, pages pending retirement, a row-remapping failure or pending remap, a recovery action other
than ``none``, an XID that is not an application's own fault (the NVIDIA device plugin's rule: 13, 31, 43, 45, 68
and 109 are left out), or could not be read at all.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

__all__ = ["NvmlReading", "XidWatcher", "health_of", "read_nvml"]

log = logging.getLogger("bcd")

T = TypeVar("T")
MIB = 1024 * 1024

# XIDs an application causes (its own faults, not the GPU's): what the NVIDIA device plugin does not count against a
# GPU's health.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

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


def read_nvml(nvml: Any, *, xids: list[dict[str, Any]] | None = None) -> NvmlReading | None:
    """Read every GPU through ``nvml`` (the ``pynvml`` module), with the XIDs seen so far (``XidWatcher.seen``;
    ``None``: not listened for); ``None`` when NVML does not start (no driver, no library, no permission), so the
    caller falls back to what it has without it."""
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
        handles = [_handle(nvml, error, index) for index in range(count)]
        for gpu, handle in zip(gpus, handles, strict=True):
            if "uuid" in gpu:
                gpu["nvlink_peers"] = _peers_or_none(nvml, error, gpu, handle, gpus, handles)
    except error as exc:
        log.warning("NVML failed while listing GPUs (%s): no GPUs reported", _text(exc))
        return None
    finally:
        with contextlib.suppress(error):
            nvml.nvmlShutdown()
    return NvmlReading(gpus=gpus, health=health_of(gpus, driver, xids), claims=_claims(gpus))


def _handle(nvml: Any, error: type[BaseException], index: int) -> Any:
    try:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    except error:
        return None


def _peers_or_none(
    nvml: Any,
    error: type[BaseException],
    gpu: dict[str, Any],
    handle: Any,
    gpus: list[dict[str, Any]],
    handles: list[Any],
) -> list[str] | None:
    try:
        return _nvlink_peers(nvml, gpu, handle, gpus, handles)
    except error:
        return None


def _nvlink_peers(
    nvml: Any, gpu: dict[str, Any], handle: Any, gpus: list[dict[str, Any]], handles: list[Any]
) -> list[str] | None:
    """The UUIDs of the GPUs ``gpu`` reaches over NVLink; ``None`` when these bindings cannot tell."""
    index = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
    if index is None or not hasattr(nvml, "nvmlDeviceGetP2PStatus"):
        return None
    peers = []
    for other, other_handle in zip(gpus, handles, strict=True):
        if other is gpu or other_handle is None or "uuid" not in other:
            continue
        if nvml.nvmlDeviceGetP2PStatus(handle, other_handle, index) == nvml.NVML_P2P_STATUS_OK:
            peers.append(other["uuid"])
    return peers


def _mig_devices(nvml: Any, error: type[BaseException], handle: Any) -> list[dict[str, Any]] | None:
    """The MIG devices of a GPU with MIG on (an empty slot is skipped); ``None`` when these bindings cannot tell."""
    if not hasattr(nvml, "nvmlDeviceGetMaxMigDeviceCount"):
        return None
    devices = []
    for slot in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except error as exc:
            if getattr(exc, "value", None) == getattr(nvml, "NVML_ERROR_NOT_FOUND", object()):
                continue
            raise
        name = _text(nvml.nvmlDeviceGetName(device))  # "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
        _, found, profile = name.rpartition(" MIG ")
        devices.append(
            {
                "uuid": _text(nvml.nvmlDeviceGetUUID(device)),
                "profile": profile if found and profile else None,
                "memory_mib": int(nvml.nvmlDeviceGetMemoryInfo(device).total) // MIB,
            }
        )
    return devices


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

    def mig() -> dict[str, Any]:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
        mode: dict[str, Any] = {
            "current": current == nvml.NVML_DEVICE_MIG_ENABLE,
            "pending": pending == nvml.NVML_DEVICE_MIG_ENABLE,
        }
        if mode["current"]:
            mode["devices"] = _optional(error, lambda: _mig_devices(nvml, error, handle))
        return mode

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


def health_of(gpus: list[dict[str, Any]], driver: str | None, xids: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The health ``diag.nvml`` reports for these ``gpus`` (entries of the ``gpus`` section) and the XIDs heard."""
    detail = []
    for gpu in gpus:
        problems = []
        seen = sorted({x["xid"] for x in xids or () if x["uuid"] == gpu.get("uuid")} - APPLICATION_XIDS)
        problems += [f"xid_{xid}" for xid in seen]
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
        "xid": xids,
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


class XidWatcher:
    """XIDs as NVML reports them (critical-error events on every GPU), collected by a thread of its own from
    ``start()`` to ``stop()``; ``seen()`` is the last ``keep`` of them, oldest first."""

    def __init__(self, nvml: Any, *, keep: int = 256, wait_ms: int = 500) -> None:
        self._nvml = nvml
        self._seen: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._wait_ms = wait_ms

    def __repr__(self) -> str:
        return f"XidWatcher(listening={self.listening})"

    @property
    def listening(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def seen(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._seen)

    def start(self) -> bool:
        """Listen on every GPU that can tell its XIDs; whether any can (NVML started, and a GPU registered)."""
        nvml, error = self._nvml, self._nvml.NVMLError
        try:
            nvml.nvmlInit()
            events = nvml.nvmlEventSetCreate()
        except error as exc:
            log.info("XIDs are not listened for: %s", _text(exc))
            return False
        registered = 0
        for index in range(_optional(error, lambda: int(nvml.nvmlDeviceGetCount())) or 0):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
                registered += 1
            except error as exc:
                log.info("GPU %d does not report XIDs: %s", index, _text(exc))
        if not registered:
            self._close(events)
            return False
        self._thread = threading.Thread(target=self._listen, args=(events,), name="bcd-xid", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self._wait_ms / 1000)

    def _listen(self, events: Any) -> None:
        nvml, error = self._nvml, self._nvml.NVMLError
        try:
            while not self._stopping.is_set():
                try:
                    data = nvml.nvmlEventSetWait_v2(events, self._wait_ms)
                except error as exc:
                    if getattr(exc, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                        continue
                    log.warning("stopped listening for XIDs: %s", _text(exc))
                    return
                device = data.device
                uuid = _optional(error, lambda: _text(nvml.nvmlDeviceGetUUID(device)))  # noqa: B023 - called at once
                xid = int(data.eventData)
                log.warning("GPU %s: XID %d", uuid, xid)
                with self._lock:
                    self._seen.append({"uuid": uuid, "xid": xid, "at_ms": round(time.time() * 1000)})
        finally:
            self._close(events)

    def _close(self, events: Any) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlEventSetFree(events)
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()
