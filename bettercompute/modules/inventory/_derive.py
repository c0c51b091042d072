"""From what a daemon reported to records: devices from inventory sections, atoms from devices, conditions from
devices, the last acceptance result and the session, and whether each atom may be booked.

Pure functions: the controllers read, call these, and write what changed. A section that is not the shape a daemon
sends (``bettercompute_daemon``: NVML's ``gpus`` entries, ``nics``, ``disks``) is not trusted in part: a malformed
entry is left out and the ``InventoryValid`` condition says so; nothing else about the node changes because of it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from bettercompute.modules.inventory._port import AtomRecord, DeviceRecord
from bettercompute.modules.nodes import ConditionRecord, NodeRecord

__all__ = [
    "CONDITION_TYPES",
    "MAX_GPUS",
    "MAX_MIG_SLICES",
    "MAX_PORTS",
    "Parsed",
    "atom_states",
    "atoms_for",
    "conditions_for",
    "device_id",
    "parse_sections",
]

MAX_GPUS = 64
"""GPUs taken from one node's ``gpus`` section; more is a malformed section (no machine has that many)."""
MAX_MIG_SLICES = 16
"""MIG slices taken per GPU (seven on today's largest GPUs)."""
MAX_PORTS = 256
"""NICs, and disks, taken per node."""
_TEXT = 256
CONDITION_TYPES = (
    "GpuHealthy",
    "EccErrors",
    "XidErrors",
    "RetiredPagesPending",
    "DriverMismatch",
    "Reachable",
    "InventoryValid",
)


def _text(value: Any) -> str | None:
    """Printable text of at most 256 characters, else ``None``."""
    if isinstance(value, str) and 0 < len(value) <= _TEXT and value.isprintable():
        return value
    return None


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53:
        return value
    return None


def device_id(node_id: str, kind: str, ident: str) -> str:
    """A device's id: stable for one node, kind and identity (the same GPU reported again is the same device)."""
    digest = hashlib.sha256(f"{node_id}\x00{kind}\x00{ident}".encode()).hexdigest()[:24]
    return f"dev_{digest}"


def _atom_id(node_id: str, ident: str) -> str:
    digest = hashlib.sha256(f"{node_id}\x00{ident}".encode()).hexdigest()[:24]
    return f"atm_{digest}"


@attrs.frozen(kw_only=True)
class Parsed:
    """What the sections said: the devices they name (``kind``, ``ident``, ``slot``, ``model``, ``details``), the GPUs
    that could not be read (by index), and what was wrong with the sections (machine-readable, empty when all was
    well)."""

    devices: tuple[tuple[str, str, str | None, str | None, dict[str, Any]], ...]
    unreadable_gpus: tuple[int, ...]
    problems: tuple[str, ...]
    fake: bool


def _gpu(entry: Mapping[str, Any], problems: list[str]) -> tuple[str, str | None, str | None, dict[str, Any]] | None:
    uuid = _text(entry.get("uuid"))
    if uuid is None:
        problems.append("gpus: an entry without a readable uuid")
        return None
    index = _count(entry.get("index"))
    details: dict[str, Any] = {
        "index": index,
        "memory_mib": _count(entry.get("memory_mib")),
        "driver_version": _text(entry.get("driver_version")),
        "pci_bus_id": _text(entry.get("pci_bus_id")),
        "serial": _text(entry.get("serial")),
    }
    mig = entry.get("mig")
    slices: list[dict[str, Any]] = []
    if isinstance(mig, Mapping):
        raw = mig.get("devices")
        if isinstance(raw, list):
            if len(raw) > MAX_MIG_SLICES:
                problems.append(f"gpus: more than {MAX_MIG_SLICES} MIG slices on a GPU")
            for item in raw[:MAX_MIG_SLICES]:
                slice_uuid = _text(item.get("uuid")) if isinstance(item, Mapping) else None
                if slice_uuid is None:
                    problems.append("gpus: a MIG slice without a readable uuid")
                    continue
                slices.append(
                    {
                        "uuid": slice_uuid,
                        "profile": _text(item.get("profile")),
                        "memory_mib": _count(item.get("memory_mib")),
                    }
                )
        details["mig"] = {
            "current": mig.get("current") is True,
            "pending": mig.get("pending") is True,
            "devices": slices,
        }
    else:
        details["mig"] = {"current": False, "pending": False, "devices": []}
    peers = entry.get("nvlink_peers")
    if isinstance(peers, list):
        details["nvlink_peers"] = [p for p in (_text(x) for x in peers[:MAX_GPUS]) if p is not None]
    else:
        details["nvlink_peers"] = []
    return uuid, str(index) if index is not None else None, _text(entry.get("model")), details


def _entries(sections: Mapping[str, Any], name: str, limit: int, problems: list[str]) -> list[Mapping[str, Any]]:
    value = sections.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        problems.append(f"{name}: not a list")
        return []
    if len(value) > limit:
        problems.append(f"{name}: more than {limit} entries")
    entries = []
    for item in value[:limit]:
        if isinstance(item, Mapping):
            entries.append(item)
        else:
            problems.append(f"{name}: an entry that is not an object")
    return entries


def parse_sections(sections: Mapping[str, Any], *, fake: bool = False) -> Parsed:
    """The devices named by a node's latest sections (``gpus``, ``nics``, ``disks``)."""
    problems: list[str] = []
    devices: list[tuple[str, str, str | None, str | None, dict[str, Any]]] = []
    unreadable: list[int] = []
    seen: set[tuple[str, str]] = set()

    def add(kind: str, ident: str, slot: str | None, model: str | None, details: dict[str, Any]) -> None:
        if (kind, ident) in seen:
            problems.append(f"{kind}s: {ident[:64]!r} is listed twice")
            return
        seen.add((kind, ident))
        devices.append((kind, ident, slot, model, details))

    for entry in _entries(sections, "gpus", MAX_GPUS, problems):
        if "error" in entry and entry.get("uuid") is None:
            index = _count(entry.get("index"))
            unreadable.append(index if index is not None else -1)
            continue
        gpu = _gpu(entry, problems)
        if gpu is not None:
            add("gpu", gpu[0], gpu[1], gpu[2], gpu[3])
    for entry in _entries(sections, "nics", MAX_PORTS, problems):
        name, mac = _text(entry.get("name")), _text(entry.get("mac"))
        ident = mac or name
        if ident is None:
            problems.append("nics: an entry without a name or MAC address")
            continue
        details = {"mac": mac, "mtu": _count(entry.get("mtu")), "speed_mbps": _count(entry.get("speed_mbps"))}
        add("nic", ident, name, None, details)
    for entry in _entries(sections, "disks", MAX_PORTS, problems):
        name, serial = _text(entry.get("name")), _text(entry.get("serial"))
        ident = serial or name
        if ident is None:
            problems.append("disks: an entry without a name or serial")
            continue
        details = {"bytes": _count(entry.get("bytes")), "rotational": entry.get("rotational") is True}
        add("disk", ident, name, _text(entry.get("model")), details)
    return Parsed(devices=tuple(devices), unreadable_gpus=tuple(unreadable), problems=tuple(problems), fake=fake)


def atoms_for(node: NodeRecord, devices: Iterable[DeviceRecord]) -> list[AtomRecord]:
    """The atoms the node's GPUs make (before availability is decided: ``atom_states`` does that): each GPU is an
    atom; a GPU with MIG on also makes one atom per slice."""
    atoms = []
    for device in devices:
        if device.kind != "gpu":
            continue
        atoms.append(
            AtomRecord(
                id=_atom_id(node.id, device.ident),
                node_id=node.id,
                device_id=device.id,
                tenant=node.tenant,
                pool_id=node.pool_id,
                kind="gpu",
                ident=device.ident,
                model=device.model,
                profile=None,
                memory_mib=device.details.get("memory_mib"),
                state="unavailable",
                reason="pending",
            )
        )
        mig = device.details.get("mig") or {}
        for piece in mig.get("devices") or () if mig.get("current") else ():
            atoms.append(
                AtomRecord(
                    id=_atom_id(node.id, piece["uuid"]),
                    node_id=node.id,
                    device_id=device.id,
                    tenant=node.tenant,
                    pool_id=node.pool_id,
                    kind="mig",
                    ident=piece["uuid"],
                    model=device.model,
                    profile=piece.get("profile"),
                    memory_mib=piece.get("memory_mib"),
                    state="unavailable",
                    reason="pending",
                )
            )
    return atoms


def _node_reason(node: NodeRecord, now: dt.datetime, grace: dt.timedelta) -> str | None:
    if node.state == "unreachable":
        since = node.unreachable_since or now
        return "node_unreachable" if now >= since + grace else None
    return {
        "adopting": "node_adopting",
        "quarantined": "node_quarantined",
        "failed": "node_failed",
        "retired": "node_retired",
    }.get(node.state)


def atom_states(
    node: NodeRecord,
    devices: Sequence[DeviceRecord],
    atoms: Sequence[AtomRecord],
    *,
    now: dt.datetime,
    grace: dt.timedelta,
) -> list[AtomRecord]:
    """``atoms`` with their availability decided: the device's first (missing, in conflict, a MIG slice no longer
    reported), then the node's state (adopting, quarantined, unreachable past the pool's grace, ...), then MIG (a
    whole GPU with MIG on is booked by its slices)."""
    by_id = {d.id: d for d in devices}
    node_reason = _node_reason(node, now, grace)
    decided = []
    for atom in atoms:
        device = by_id.get(atom.device_id)
        reason: str | None
        if device is None or device.state == "missing":
            reason = "device_missing"
        elif device.state == "conflict":
            reason = "device_conflict"
        else:
            reason = node_reason
            mig = device.details.get("mig") or {}
            slices = {p["uuid"] for p in mig.get("devices") or ()} if mig.get("current") else set()
            if atom.kind == "mig" and atom.ident not in slices:
                reason = "device_missing"
            elif reason is None and atom.kind == "gpu" and mig.get("current"):
                reason = "mig_enabled"
        state = "available" if reason is None else "unavailable"
        decided.append(attrs.evolve(atom, state=state, reason=reason))
    return decided


def _condition(kind: str, status: str, reason: str, message: str) -> ConditionRecord:
    return ConditionRecord(type=kind, status=status, reason=reason, message=message)


def conditions_for(
    devices: Sequence[DeviceRecord],
    *,
    problems: Sequence[str],
    unreadable_gpus: Sequence[int],
    findings: Sequence[Mapping[str, Any]] | None,
    reachable: tuple[bool, str, str],
) -> list[ConditionRecord]:
    """Every condition of a node from its devices, what was wrong with its sections, the findings of its last
    ``diag.nvml`` (``None`` before any), and its session (``reachable``: status, reason, message)."""
    gpus = [d for d in devices if d.kind == "gpu"]
    missing = [d.ident for d in gpus if d.state == "missing"]
    conflict = [d.ident for d in gpus if d.state == "conflict"]
    found = list(findings or ())
    by_reason: dict[str, list[str]] = {}
    for finding in found:
        by_reason.setdefault(str(finding.get("reason")), []).append(str(finding.get("uuid") or "the node"))
    out = []
    if conflict:
        out.append(_condition("GpuHealthy", "False", "DuplicateUuid", f"claimed by another node: {conflict[:8]}"))
    elif missing:
        out.append(_condition("GpuHealthy", "False", "DeviceMissing", f"no longer reported: {missing[:8]}"))
    elif unreadable_gpus:
        out.append(
            _condition("GpuHealthy", "False", "GpuUnreadable", f"GPUs NVML cannot read: {list(unreadable_gpus)}")
        )
    elif found:
        first = found[0]
        out.append(
            _condition("GpuHealthy", "False", "AcceptanceFindings", f"{first.get('reason')} on {first.get('uuid')}")
        )
    elif findings is None:
        out.append(_condition("GpuHealthy", "Unknown", "NotChecked", "no diag.nvml result yet"))
    else:
        out.append(_condition("GpuHealthy", "True", "Healthy", f"{len(gpus)} GPUs pass"))

    def fact(kind: str, reasons: Sequence[str], what: str) -> None:
        hits = [
            uuid
            for reason, uuids in by_reason.items()
            if any(reason == p or (p.endswith("_") and reason.startswith(p)) for p in reasons)
            for uuid in uuids
        ]
        if findings is None:
            out.append(_condition(kind, "Unknown", "NotChecked", "no diag.nvml result yet"))
        elif hits:
            out.append(_condition(kind, "True", kind, f"{what} on {sorted(set(hits))[:8]}"))
        else:
            out.append(_condition(kind, "False", "None", f"no {what}"))

    fact("EccErrors", ["ecc_uncorrectable"], "uncorrectable ECC errors")
    fact("XidErrors", ["xid_"], "fatal XIDs")
    fact("RetiredPagesPending", ["retired_pages_pending"], "pages pending retirement")
    drivers = sorted(
        {str(d.details.get("driver_version")) for d in gpus if d.state == "present" and d.details.get("driver_version")}
    )
    if len(drivers) > 1:
        out.append(_condition("DriverMismatch", "True", "DriverMismatch", f"GPUs report drivers {drivers[:4]}"))
    else:
        out.append(_condition("DriverMismatch", "False", "SameDriver", f"driver {drivers[0] if drivers else 'none'}"))
    out.append(_condition("Reachable", "True" if reachable[0] else "False", reachable[1], reachable[2]))
    if problems:
        out.append(_condition("InventoryValid", "False", "MalformedSection", "; ".join(problems[:4])[:500]))
    else:
        out.append(_condition("InventoryValid", "True", "WellFormed", "every section is well formed"))
    return out
