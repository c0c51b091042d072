"""The CDI spec ``bcd node`` writes for a desired state: the allocated GPUs and allocations as CDI devices, in the
format of the CDI specification (cdiVersion 0.6.0), atomically, and only what matches this node's inventory."""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from bettercompute_daemon._cdi import SPEC_FILE, apply_desired_state, cdi_spec

GPUS: list[dict[str, Any]] = [
    {"uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "model": "H100", "minor": 0},
    {"uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000001", "model": "H100", "minor": 1},
    {"uuid": "GPU-cccccccc-0000-0000-0000-000000000002", "model": "H100", "minor": 2},
    {"uuid": "GPU-no-minor", "model": "H100"},
]
A, B, C = (g["uuid"] for g in GPUS[:3])
# The CDI specification's rules for names (pkg/parser): a kind is vendor/class, a device name starts and ends with
# a letter or digit and holds letters, digits, '_', '-', '.' and ':'.
DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?")


def apply(folder: Path, content: Any, generation: int = 1) -> list[str]:
    return apply_desired_state(folder, json.dumps(content), GPUS, generation=generation)


def written(folder: Path) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads((folder / SPEC_FILE).read_text())
    return spec


def devices(spec: dict[str, Any]) -> dict[str, list[str]]:
    return {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}


def test_allocated_gpus_and_allocations_become_cdi_devices(tmp_path: Path) -> None:
    folder = tmp_path / "cdi"
    content = {"allocations": [{"id": "alloc-2", "gpus": [C, A]}, {"id": "alloc-1", "gpus": [B]}], "other": {}}
    assert apply(folder, content, generation=7) == []
    spec = written(folder)
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "bettercompute.io/gpu"
    assert spec["annotations"] == {"bettercompute.io/generation": "7"}
    assert devices(spec) == {
        A: ["/dev/nvidia0"],
        B: ["/dev/nvidia1"],
        C: ["/dev/nvidia2"],
        "alloc-1": ["/dev/nvidia1"],
        "alloc-2": ["/dev/nvidia0", "/dev/nvidia2"],
    }
    assert [n["path"] for n in spec["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    assert all(DEVICE_NAME.fullmatch(name) for name in devices(spec))
    assert stat.S_IMODE((folder / SPEC_FILE).stat().st_mode) == 0o644
    assert os.listdir(folder) == [SPEC_FILE]  # no temporary file left behind


def test_the_spec_is_replaced_whole_and_removed_when_nothing_is_allocated(tmp_path: Path) -> None:
    assert apply(tmp_path, {"allocations": [{"id": "alloc-1", "gpus": [A, B]}]}) == []
    assert apply(tmp_path, {"allocations": [{"id": "alloc-2", "gpus": [C]}]}, generation=2) == []
    assert set(devices(written(tmp_path))) == {C, "alloc-2"}
    # CDI holds a spec without devices invalid: no allocation, no file.
    assert apply(tmp_path, {"allocations": []}, generation=3) == []
    assert not (tmp_path / SPEC_FILE).exists()
    assert apply(tmp_path, {}, generation=4) == []  # and nothing to remove is fine
    assert not (tmp_path / SPEC_FILE).exists()


@pytest.mark.parametrize(
    ("allocation", "problem"),
    [
        (
            {"id": "alloc-x", "gpus": ["GPU-unknown"]},
            "allocation alloc-x: GPU GPU-unknown is not in this node's inventory",
        ),
        (
            {"id": "alloc-x", "gpus": ["GPU-no-minor"]},
            "allocation alloc-x: GPU GPU-no-minor is not in this node's inventory",
        ),
        (
            {"id": "alloc-x", "gpus": ["GPU-\n$(x)"]},
            "allocation alloc-x: GPU GPU-\\n$(x) is not in this node's inventory",
        ),
        ({"id": "alloc-x", "gpus": [A]}, f"allocation alloc-x: {A} is already in allocation alloc-1"),
        ({"id": "alloc-x", "gpus": [B, B]}, "allocation alloc-x: gpus: a GPU is named twice"),
        ({"id": "alloc-x", "gpus": []}, "allocation alloc-x: gpus: expected a list of GPU UUIDs"),
        ({"id": "alloc-x", "gpus": [1]}, "allocation alloc-x: gpus: expected a list of GPU UUIDs"),
        ({"id": "alloc-1", "gpus": [B]}, "allocation alloc-1: its id is already a device name"),
        ({"id": A, "gpus": [B]}, f"allocation {A}: its id is already a device name"),
        (
            {"id": "-alloc", "gpus": [B]},
            "allocations[1].id: expected a CDI device name (A-Z, a-z, 0-9, then also _ - . :)",
        ),
        (
            {"id": "al/loc", "gpus": [B]},
            "allocations[1].id: expected a CDI device name (A-Z, a-z, 0-9, then also _ - . :)",
        ),
        ("alloc-x", "allocations[1]: expected an object"),
    ],
)
def test_an_allocation_that_cannot_be_applied_is_left_out_whole(tmp_path: Path, allocation: Any, problem: str) -> None:
    content = {"allocations": [{"id": "alloc-1", "gpus": [A]}, allocation]}
    assert apply(tmp_path, content) == [problem]
    assert set(devices(written(tmp_path))) == {A, "alloc-1"}  # the other allocation is still written


@pytest.mark.parametrize(
    ("content", "problem"),
    [("not json", "the desired state is not JSON"), ([], "the desired state is not a JSON object")],
)
def test_a_malformed_desired_state_leaves_the_spec_as_it_was(
    tmp_path: Path, content: str | list[Any], problem: str
) -> None:
    assert apply(tmp_path, {"allocations": [{"id": "alloc-1", "gpus": [A]}]}) == []
    before = (tmp_path / SPEC_FILE).read_bytes()
    raw = content if isinstance(content, str) else json.dumps(content)
    assert apply_desired_state(tmp_path, raw, GPUS, generation=2) == [problem]
    assert apply(tmp_path, {"allocations": {"id": "alloc-2"}}, generation=3) == ["allocations: expected a list"]
    assert (tmp_path / SPEC_FILE).read_bytes() == before


def test_a_folder_that_cannot_be_written_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    [problem] = apply(blocker / "cdi", {"allocations": [{"id": "alloc-1", "gpus": [A]}]})
    assert problem.startswith(f"the CDI spec could not be written in {blocker / 'cdi'}: ")


def test_only_gpus_of_the_inventory_with_a_minor_number_count() -> None:
    spec, problems = cdi_spec({"allocations": [{"id": "a", "gpus": [A]}]}, [{"uuid": A, "minor": True}], generation=1)
    assert spec is None and problems == [f"allocation a: GPU {A} is not in this node's inventory"]
