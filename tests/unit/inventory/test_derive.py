"""The acceptance gate and the derivation of devices, atoms and conditions, as pure functions: what quarantines a
node, what a malformed section does (and does not) change, and when an atom may be booked."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs
import pytest

from bettercompute.modules.inventory import GpuOwner, judge_nvml
from bettercompute.modules.inventory._controllers import _devices
from bettercompute.modules.inventory._derive import MAX_GPUS, atom_states, atoms_for, conditions_for, parse_sections
from bettercompute.modules.nodes import NodeRecord
from bettercompute.modules.pools import NodePolicy

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


def node(state: str = "adopted", **changes: Any) -> NodeRecord:
    record = NodeRecord(
        id="node_1",
        tenant="acme",
        pool_id="pool_1",
        site_id=None,
        state=state,
        hardware_key="hk",
        claims={},
        attestation={},
        join_token_id=None,
        enrollments=1,
        session_epoch=1,
        desired_generation=1,
        observed_generation=1,
        last_seen_at=None,
        joined_at=NOW,
        created_at=NOW,
        updated_at=NOW,
        retired_at=None,
    )
    return attrs.evolve(record, **changes)


def gpu_health(**fields: Any) -> dict[str, Any]:
    detail = {
        "index": 0,
        "uuid": "GPU-a",
        "ecc_uncorrectable": 0,
        "retired_pages_pending": False,
        "recovery_action": "none",
        "problems": [],
    }
    return {"health": {"healthy": True, "xid": [], "gpus": [{**detail, **fields}]}, "fake": False}


def test_a_healthy_reading_passes_whatever_the_verdict_says() -> None:
    assert judge_nvml(gpu_health(), NodePolicy()) == []
    # The daemon's one-word verdict is not what is judged: only NVML's facts.
    reading = gpu_health()
    reading["health"]["healthy"] = False
    assert judge_nvml(reading, NodePolicy()) == []


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"ecc_uncorrectable": 3}, "ecc_uncorrectable"),
        ({"retired_pages_pending": True}, "retired_pages_pending"),
        ({"recovery_action": "gpu_reset"}, "recovery_action"),
        ({"problems": ["unreadable"]}, "gpu_unreadable"),
    ],
)
def test_each_nvml_fact_fails_the_gate(fields: dict[str, Any], reason: str) -> None:
    findings = judge_nvml(gpu_health(**fields), NodePolicy())
    assert [(f["reason"], f["uuid"]) for f in findings] == [(reason, "GPU-a")]


def test_the_thresholds_are_the_pools() -> None:
    lenient = NodePolicy(
        max_ecc_uncorrectable=5, quarantine_retired_pages_pending=False, quarantine_recovery_action=False
    )
    assert (
        judge_nvml(gpu_health(ecc_uncorrectable=5, retired_pages_pending=True, recovery_action="gpu_reset"), lenient)
        == []
    )
    assert [f["reason"] for f in judge_nvml(gpu_health(ecc_uncorrectable=6), lenient)] == ["ecc_uncorrectable"]


def test_only_fatal_xids_count_and_the_pool_names_them() -> None:
    reading = gpu_health()
    reading["health"]["xid"] = [{"uuid": "GPU-a", "xid": 13, "at_ms": 1}, {"uuid": "GPU-a", "xid": 79, "at_ms": 2}]
    assert [f["reason"] for f in judge_nvml(reading, NodePolicy())] == ["xid_79"]
    assert judge_nvml(reading, NodePolicy(fatal_xids=(48,))) == []
    assert [f["reason"] for f in judge_nvml(reading, NodePolicy(fatal_xids=(13, 79)))] == ["xid_13", "xid_79"]


@pytest.mark.parametrize("result", [{}, {"health": "ok"}, {"health": None}, {"health": {"gpus": ["x"]}}])
def test_a_malformed_result_fails_rather_than_passes(result: dict[str, Any]) -> None:
    assert [f["reason"] for f in judge_nvml(result, NodePolicy())] == ["malformed_result"]


def test_a_declared_health_without_per_gpu_detail_is_judged_by_its_totals() -> None:
    declared = {"health": {"healthy": True, "ecc_uncorrectable": 2}, "fake": True}
    assert [f["reason"] for f in judge_nvml(declared, NodePolicy())] == ["ecc_uncorrectable"]


GPUS = {
    "gpus": [
        {"index": 0, "uuid": "GPU-a", "model": "H100", "memory_mib": 81559, "driver_version": "550.1"},
        {
            "index": 1,
            "uuid": "GPU-b",
            "model": "A100",
            "memory_mib": 81920,
            "driver_version": "550.1",
            "mig": {
                "current": True,
                "pending": False,
                "devices": [
                    {"uuid": "MIG-b1", "profile": "3g.40gb", "memory_mib": 40000},
                    {"uuid": "MIG-b2", "profile": "3g.40gb", "memory_mib": 40000},
                ],
            },
            "nvlink_peers": ["GPU-a"],
        },
    ],
    "nics": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "mtu": 1500}],
    "disks": [{"name": "nvme0n1", "serial": "S1", "bytes": 10**12}],
}


def test_a_whole_gpu_or_its_mig_slices_are_the_atoms() -> None:
    parsed = parse_sections(GPUS)
    assert parsed.problems == ()
    devices = _devices(node(), parsed, [], {})
    atoms = atom_states(node(), devices, atoms_for(node(), devices), now=NOW, grace=dt.timedelta(minutes=5))
    by_ident = {a.ident: (a.kind, a.state, a.reason) for a in atoms}
    assert by_ident == {
        "GPU-a": ("gpu", "available", None),
        "GPU-b": ("gpu", "unavailable", "mig_enabled"),
        "MIG-b1": ("mig", "available", None),
        "MIG-b2": ("mig", "available", None),
    }
    assert {d.kind for d in devices} == {"gpu", "nic", "disk"}


def test_a_gpu_that_disappears_is_missing_and_its_atom_is_kept_unavailable() -> None:
    before = _devices(node(), parse_sections(GPUS), [], {})
    known = atoms_for(node(), before)
    after = _devices(node(), parse_sections({**GPUS, "gpus": GPUS["gpus"][:1]}), before, {})
    assert {d.ident: d.state for d in after if d.kind == "gpu"} == {"GPU-a": "present", "GPU-b": "missing"}
    atoms = atom_states(node(), after, known, now=NOW, grace=dt.timedelta(minutes=5))
    assert {a.ident: a.reason for a in atoms} == {
        "GPU-a": None,
        "GPU-b": "device_missing",
        "MIG-b1": "device_missing",
        "MIG-b2": "device_missing",
    }
    conditions = {
        c.type: c
        for c in conditions_for(
            after, problems=(), unreadable_gpus=(), findings=[], reachable=(True, "SessionOpen", "")
        )
    }
    assert (conditions["GpuHealthy"].status, conditions["GpuHealthy"].reason) == ("False", "DeviceMissing")


def test_a_uuid_another_node_holds_is_a_conflict_not_capacity() -> None:
    holder = GpuOwner(node_id="node_other", same_tenant=True, attested=False)
    devices = _devices(node(), parse_sections(GPUS), [], {"GPU-a": holder})
    assert {d.ident: d.state for d in devices if d.kind == "gpu"} == {"GPU-a": "conflict", "GPU-b": "present"}
    atoms = atom_states(node(), devices, atoms_for(node(), devices), now=NOW, grace=dt.timedelta(minutes=5))
    assert {a.ident: a.reason for a in atoms}["GPU-a"] == "device_conflict"


@pytest.mark.parametrize(
    "sections",
    [
        {"gpus": "garbage"},
        {"gpus": [1, 2, 3]},
        {"gpus": [{"model": "H100"}]},
        {"gpus": [{"uuid": "x" * 300}]},
        {"gpus": [{"uuid": f"GPU-{n}"} for n in range(MAX_GPUS + 1)]},
        {"gpus": [{"uuid": "GPU-a"}, {"uuid": "GPU-a"}]},
        {"nics": {"eth0": {}}},
        {"disks": [{"bytes": 5}]},
    ],
)
def test_a_malformed_section_is_an_invalid_inventory_condition(sections: dict[str, Any]) -> None:
    parsed = parse_sections(sections)
    assert parsed.problems
    conditions = conditions_for(
        [], problems=parsed.problems, unreadable_gpus=(), findings=None, reachable=(True, "SessionOpen", "")
    )
    valid = next(c for c in conditions if c.type == "InventoryValid")
    assert (valid.status, valid.reason) == ("False", "MalformedSection")
    assert len(valid.message) <= 500


@pytest.mark.parametrize(
    ("state", "since", "reason"),
    [
        ("adopting", None, "node_adopting"),
        ("quarantined", None, "node_quarantined"),
        ("retired", None, "node_retired"),
        ("unreachable", NOW - dt.timedelta(minutes=1), None),  # within the grace: bookings stay put
        ("unreachable", NOW - dt.timedelta(minutes=6), "node_unreachable"),
    ],
)
def test_the_node_state_decides_first(state: str, since: dt.datetime | None, reason: str | None) -> None:
    record = node(state, unreachable_since=since)
    devices = _devices(record, parse_sections({"gpus": GPUS["gpus"][:1]}), [], {})
    [atom] = atom_states(record, devices, atoms_for(record, devices), now=NOW, grace=dt.timedelta(minutes=5))
    assert atom.reason == reason
    assert atom.state == ("available" if reason is None else "unavailable")


def test_gpus_on_different_drivers_are_a_driver_mismatch() -> None:
    gpus = [dict(GPUS["gpus"][0]), {**GPUS["gpus"][0], "uuid": "GPU-c", "index": 2, "driver_version": "535.9"}]
    devices = _devices(node(), parse_sections({"gpus": gpus}), [], {})
    conditions = {
        c.type: c.status
        for c in conditions_for(devices, problems=(), unreadable_gpus=(), findings=[], reachable=(True, "x", ""))
    }
    assert conditions["DriverMismatch"] == "True"
