"""The CDI spec of the GPUs allocated on this node, written whenever a desired state arrives.

The Container Device Interface (github.com/cncf-tags/container-device-interface, SPEC.md) lets a container runtime
(containerd, CRI-O, Podman, Docker) hand a container named devices: ``--device bettercompute.io/gpu=<name>``. One
file, ``bettercompute.io-gpu.json`` in ``--cdi-dir`` (``/var/run/cdi``, the directory for generated specs), kind
``bettercompute.io/gpu`` (our own vendor prefix, so it never collides with the ``nvidia.com/gpu`` spec the NVIDIA
Container Toolkit generates, which brings the driver libraries; this one names devices only), ``cdiVersion``
``0.6.0`` (the oldest that takes annotations), with:

- one device per allocated GPU, named by its UUID (``GPU-...``), with its device node ``/dev/nvidia<minor>`` (the
  minor number from the inventory);
- one device per allocation, named by the allocation id, with every GPU of the allocation;
- for any of them, the control nodes ``/dev/nvidiactl``, ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools``.

The desired state's content (decided with the control plane)::

    {"allocations": [{"id": "<allocation id>", "gpus": ["GPU-<uuid>", ...]}]}

(other keys are left to other readers; an allocation of MIG slices only, ``"gpus": []`` with ``"mig": [...]``, is not
written: this version has no MIG devices in the spec). An allocation that names a GPU this node's inventory does not
have (or one without a minor number), a malformed one, or one that takes a GPU another allocation has, is left out of
the file whole and reported; the others are written. The caller acknowledges the generation only when nothing was left
out, so the control plane sees a node that did not apply its desired state. No allocation: the file is removed (CDI
holds a spec with no device invalid). The file is written to a temporary file and renamed, mode 0644 (runtimes read
it; it holds no secret)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CDI_VERSION",
    "DEFAULT_CDI_DIR",
    "KIND",
    "SPEC_FILE",
    "MalformedDesiredState",
    "apply_desired_state",
    "cdi_spec",
]

DEFAULT_CDI_DIR = Path("/var/run/cdi")
KIND = "bettercompute.io/gpu"
SPEC_FILE = "bettercompute.io-gpu.json"
CDI_VERSION = "0.6.0"
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

# CDI's device names: ASCII letters and digits at both ends, '_', '-', '.' and ':' between.
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]{0,254}[A-Za-z0-9])?")


class MalformedDesiredState(ValueError):
    """A desired state that is not the contract's shape at all: nothing of it is applied."""


def cdi_spec(
    content: Any, gpus: Sequence[Mapping[str, Any]], *, generation: int
) -> tuple[dict[str, Any] | None, list[str]]:
    """The spec for a desired state's content and this node's inventory GPUs: ``(spec, what was left out)``; the
    spec is ``None`` when no allocation is left to write (see the module docstring).

    Raises:
        MalformedDesiredState: the content is not an object, or its ``allocations`` not a list.
    """
    if not isinstance(content, dict):
        raise MalformedDesiredState("the desired state is not a JSON object")
    allocations = content.get("allocations", [])
    if not isinstance(allocations, list):
        raise MalformedDesiredState("allocations: expected a list")
    minors: dict[str, int] = {}
    for gpu in gpus:
        uuid, minor = gpu.get("uuid"), gpu.get("minor")
        if isinstance(uuid, str) and isinstance(minor, int) and not isinstance(minor, bool) and minor >= 0:
            minors[uuid] = minor
    problems: list[str] = []
    taken: dict[str, str] = {}  # GPU uuid -> the allocation that has it
    written: list[tuple[str, list[str]]] = []
    for index, allocation in enumerate(allocations):
        if isinstance(allocation, dict) and allocation.get("gpus") == [] and allocation.get("mig"):
            # MIG slices only: this version names no MIG device in the spec (their device nodes come with MIG
            # support in the daemon); nothing of the allocation is left to write, so nothing is left out.
            continue
        problem, allocation_id, uuids = _allocation(allocation, index, minors)
        if problem is None:
            if any(allocation_id == a for a, _ in written) or allocation_id in minors:
                problem = f"allocation {allocation_id}: its id is already a device name"
            elif clash := [u for u in uuids if u in taken]:
                problem = f"allocation {allocation_id}: {clash[0]} is already in allocation {taken[clash[0]]}"
        if problem is not None:
            problems.append(problem)
            continue
        taken.update(dict.fromkeys(uuids, allocation_id))
        written.append((allocation_id, uuids))
    if not written:
        return None, problems

    def nodes(uuids: list[str]) -> list[dict[str, Any]]:
        return [{"path": f"/dev/nvidia{minors[u]}"} for u in sorted(uuids, key=minors.__getitem__)]

    devices = [
        {"name": u, "containerEdits": {"deviceNodes": nodes([u])}} for u in sorted(taken, key=minors.__getitem__)
    ]
    devices += [{"name": a, "containerEdits": {"deviceNodes": nodes(u)}} for a, u in sorted(written)]
    spec = {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "annotations": {"bettercompute.io/generation": str(generation)},
        "devices": devices,
        "containerEdits": {"deviceNodes": [{"path": path} for path in CONTROL_NODES]},
    }
    return spec, problems


def _allocation(allocation: Any, index: int, minors: Mapping[str, int]) -> tuple[str | None, str, list[str]]:
    """``(problem, id, GPU uuids)`` of one allocation."""
    if not isinstance(allocation, dict):
        return f"allocations[{index}]: expected an object", "", []
    allocation_id, uuids = allocation.get("id"), allocation.get("gpus")
    if not isinstance(allocation_id, str) or not _NAME.fullmatch(allocation_id):
        return f"allocations[{index}].id: expected a CDI device name (A-Z, a-z, 0-9, then also _ - . :)", "", []
    if not isinstance(uuids, list) or not uuids or not all(isinstance(u, str) for u in uuids):
        return f"allocation {allocation_id}: gpus: expected a list of GPU UUIDs", allocation_id, []
    if len(set(uuids)) != len(uuids):
        return f"allocation {allocation_id}: gpus: a GPU is named twice", allocation_id, []
    missing = [u for u in uuids if u not in minors or not _NAME.fullmatch(u)]
    if missing:
        shown = json.dumps(missing[0])[1:-1][:64]  # the control plane's text, escaped before it reaches a log
        return f"allocation {allocation_id}: GPU {shown} is not in this node's inventory", allocation_id, []
    return None, allocation_id, list(uuids)


def apply_desired_state(
    directory: Path, content_json: str, gpus: Sequence[Mapping[str, Any]], *, generation: int
) -> list[str]:
    """Write (or remove) the CDI spec for a desired state; what was left out, or why nothing was written."""
    try:
        spec, problems = cdi_spec(json.loads(content_json), gpus, generation=generation)
    except MalformedDesiredState as exc:
        return [str(exc)]  # the spec on disk stays as it was
    except ValueError:
        return ["the desired state is not JSON"]
    try:
        if spec is None:
            (directory / SPEC_FILE).unlink(missing_ok=True)
        else:
            _write(directory, json.dumps(spec, indent=2).encode() + b"\n")
    except OSError as exc:
        problems.append(f"the CDI spec could not be written in {directory}: {exc.strerror or type(exc).__name__}")
    return problems


def _write(directory: Path, data: bytes) -> None:
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    # A hidden name ending .tmp: CDI caches read only *.json and *.yaml, so a half-written file is never loaded.
    temporary = directory / f".{SPEC_FILE}.tmp"
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "wb") as file:
        os.fchmod(file.fileno(), 0o644)  # whatever the umask
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / SPEC_FILE)
