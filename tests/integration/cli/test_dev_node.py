"""``better-compute dev`` joins a simulated node with 8 fake GPUs by itself, through its own gateway; it is adopted a
few seconds later, and dev prints what to try next; a second run reconnects the same node instead of joining
again."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx

from tests._timing import deadline

from .conftest import StartCli, free_port

IN_SESSION = "A simulated node with 8 fake GPUs is in session: "


def test_dev_joins_a_simulated_node_and_a_second_run_reuses_it(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    port, gateway_port = free_port(), free_port()
    env = {
        **cli_env,
        "BETTERCOMPUTE_TRUST_DOMAIN": "dev.localhost",
        "BETTERCOMPUTE_GATEWAY_ADDRESS": f"127.0.0.1:{gateway_port}",
    }
    dev = start_cli(env, "dev", "--port", str(port), cwd=tmp_path)
    dev.wait_for(IN_SESSION, timeout=60)
    token = re.search(r"export TOKEN=(bcak_\S+)", dev.stdout)
    assert token is not None, dev.stdout
    headers = {"Authorization": f"Bearer {token[1]}"}

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(
            f"http://127.0.0.1:{port}/api/compute/{path}", headers=headers, json=body, timeout=deadline(10)
        )
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()["data"]
        return data

    out = dev.stdout
    node_id = out.split(IN_SESSION, 1)[1].split(",", 1)[0]
    for command in ("login", "nodes watch", "reservations create", "join-tokens create"):  # test_dev_commands runs them
        assert f" better-compute {command} " in out or f" better-compute {command}\n" in out, out
    assert "/api/compute/reservations/create" in out, out
    root = call("system/whoami", {})["tenant_id"]
    [node] = call("nodes/list", {"tenant": root})["nodes"]
    assert node["id"] == node_id and node["claims"]["gpu_count"] == 8 and node["session_epoch"] == 1
    [pool] = call("pools/list", {"tenant": root})["pools"]
    assert pool["name"] == "dev" and node["pool_id"] == pool["id"]
    assert (tmp_path / ".bettercompute" / "node" / "0" / "node.crt").exists()
    # The lifecycle controller runs its acceptance check (diag.nvml) and adopts it, with its 8 GPUs as atoms.
    ends = time.monotonic() + deadline(30)
    while (seen := call("nodes/get", {"id": node_id}))["state"] != "adopted" or seen["desired_state_pending"]:
        assert time.monotonic() < ends, f"the simulated node was not adopted: {seen}"
        time.sleep(0.2)
    devices = call("devices/list", {"tenant": root, "node_id": node_id})["devices"]
    assert len([d for d in devices if d["kind"] == "gpu"]) == 8
    assert dev.stop() == 0
    assert "Traceback" not in dev.stderr

    again = start_cli(env, "dev", "--port", str(port), cwd=tmp_path)
    again.wait_for(IN_SESSION, timeout=60)
    assert "already exists" in again.stdout and "export TOKEN=" not in again.stdout
    [node] = call("nodes/list", {"tenant": root})["nodes"]
    assert node["id"] == node_id and node["session_epoch"] == 2  # the same node, reconnected, not a new one
    assert node["state"] == "adopted"
    assert len(call("pools/list", {"tenant": root})["pools"]) == 1
    assert again.stop() == 0
    assert "Traceback" not in again.stderr
