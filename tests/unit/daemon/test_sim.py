"""What ``bcd sim`` declares for its nodes: the same for the same seed, in the shapes NVML's mapping gives a real
machine, with exactly the faults asked for."""

from __future__ import annotations

from typing import Any

from bettercompute_daemon._nvml import health_of
from bettercompute_daemon._sim import MODELS, SimOptions, node_inventory, plan_faults


def fleet(options: SimOptions) -> list[dict[str, Any]]:
    faults = plan_faults(options)
    return [node_inventory(options, index, faults) for index in range(options.nodes)]


def test_the_same_seed_declares_the_same_fleet_and_another_seed_another() -> None:
    options = SimOptions(nodes=30, seed=4, unhealthy=0.05, fail_acceptance=0.1)
    assert fleet(options) == fleet(options)
    other = fleet(SimOptions(nodes=30, seed=5, unhealthy=0.05, fail_acceptance=0.1))
    uuids = {g["uuid"] for n in fleet(options) for g in n["sections"]["gpus"]}
    assert len(uuids) == 240
    assert uuids.isdisjoint({g["uuid"] for n in other for g in n["sections"]["gpus"]})


def test_a_mix_of_models_mig_and_nvlink_in_the_shapes_nvml_gives() -> None:
    nodes = fleet(SimOptions(nodes=60, seed=1))
    models = {n["claims"]["gpu_model"] for n in nodes}
    assert models == {m.name for m in MODELS}
    mig_nodes = [n for n in nodes if n["sections"]["gpus"][0]["mig"] and n["sections"]["gpus"][0]["mig"]["current"]]
    assert mig_nodes  # some nodes run with MIG on
    for node in nodes:
        gpus = node["sections"]["gpus"]
        assert node["claims"]["gpu_uuids"] == [g["uuid"] for g in gpus] and node["claims"]["gpu_count"] == 8
        for gpu in gpus:
            mig = gpu["mig"]
            if gpu["model"] == "NVIDIA L40S":
                assert mig is None and gpu["nvlink_peers"] == []
            else:
                assert set(gpu["nvlink_peers"]) == {g["uuid"] for g in gpus} - {gpu["uuid"]}
                if mig["current"]:
                    assert [d["profile"] for d in mig["devices"]] == ["1g.10gb"] * 7
                    assert all(d["uuid"].startswith("MIG-") and d["memory_mib"] > 9000 for d in mig["devices"])
                else:
                    assert mig == {"current": False, "pending": False}
        # The health is what diag.nvml on a real machine with these GPUs says.
        assert node["health"] == health_of(gpus, gpus[0]["driver_version"], []) and node["health"]["healthy"]


def test_exactly_the_share_of_unhealthy_gpus_and_failing_nodes() -> None:
    options = SimOptions(nodes=40, seed=9, unhealthy=0.025, fail_acceptance=0.1)
    nodes = fleet(options)
    bad = [(i, g) for i, n in enumerate(nodes) for g in n["health"]["gpus"] if g["problems"]]
    faults = plan_faults(options)
    assert len(faults.unhealthy) == 8 and len(faults.failing) == 4
    problems = {p for _, g in bad for p in g["problems"]}
    assert problems <= {"ecc_uncorrectable", "xid_79"}
    for index in faults.failing:
        node = nodes[index]
        assert node["health"]["gpus"][0]["ecc_uncorrectable"] >= 1 and not node["health"]["healthy"]
    for index, gpu in faults.unhealthy:
        health = nodes[index]["health"]
        detail = health["gpus"][gpu]
        assert detail["problems"] in (["ecc_uncorrectable"], ["xid_79"])
        if detail["problems"] == ["xid_79"]:
            assert {"uuid": detail["uuid"], "xid": 79} in [{k: x[k] for k in ("uuid", "xid")} for x in health["xid"]]
        else:  # an ECC error shows in the inventory too
            assert nodes[index]["sections"]["gpus"][gpu]["ecc"]["volatile"]["uncorrected"] >= 1
    healthy = [n for i, n in enumerate(nodes) if i not in faults.failing and i not in {i for i, _ in faults.unhealthy}]
    assert healthy and all(n["health"]["healthy"] for n in healthy)
