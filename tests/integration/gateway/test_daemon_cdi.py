"""A real ``bcd node`` given desired state (``set_desired_state``, pushed by the gateway to its session) writes the
CDI spec of its allocated GPUs (from its declared inventory's minor numbers), and says when it could not apply all of
it: then it does not acknowledge, and the node's ``observed_generation`` stays behind."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from bettercompute.modules.nodes import NODES

from .conftest import Wire
from .test_daemon import wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

BCD = str(Path(sys.executable).parent / "bcd")
GPU_A = "GPU-4b0c1a2e-0000-4000-8000-000000000000"
GPU_B = "GPU-4b0c1a2e-0000-4000-8000-000000000001"


async def push(gw: Wire, node_id: str, generation: int, content: dict[str, Any]) -> None:
    assert (await gw.fleet.desire(node_id, content)).generation == generation


async def observed(gw: Wire, node_id: str) -> int:
    node = await gw.fleet.store.repository(NODES).get(node_id)
    assert node is not None
    return node.observed_generation


async def test_desired_state_becomes_a_cdi_spec_of_the_allocated_gpus(gw: Wire, tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.json"
    gpus = [{"uuid": GPU_A, "model": "H100", "minor": 0}, {"uuid": GPU_B, "model": "H100", "minor": 3}]
    claims = {"hostname": "gpu-cdi", "serial": "SN-CDI-1", "product": "PowerEdge XE9680"}
    inventory.write_text(json.dumps({"claims": claims, "sections": {"gpus": gpus}}))
    common = ["--state-dir", str(tmp_path / "bcd"), "--fake-inventory", str(inventory)]
    token = await gw.fleet.token()
    args = shlex.split(token.join_command)[2:]
    args[args.index("--gateway") + 1] = f"127.0.0.1:{gw.port}"
    joined = await anyio.run_process([BCD, *common, "join", *args], check=False)
    assert joined.returncode == 0, joined.stderr.decode()
    node_id = json.loads((tmp_path / "bcd" / "node.json").read_text())["node_id"]

    cdi = tmp_path / "cdi"
    log = tmp_path / "bcd.err"
    with log.open("wb") as err:
        daemon = await asyncio.create_subprocess_exec(
            BCD, *common, "node", "--cdi-dir", str(cdi), stdout=asyncio.subprocess.DEVNULL, stderr=err
        )
    try:

        async def in_session() -> bool:
            return node_id in gw.gateway.sessions

        await wait_for(in_session)
        await push(gw, node_id, 1, {"allocations": [{"id": "alloc-1", "gpus": [GPU_B, GPU_A]}]})
        spec_file = cdi / "bettercompute.io-gpu.json"

        async def written() -> bool:
            return spec_file.exists()

        await wait_for(written)
        spec = json.loads(spec_file.read_text())
        assert spec["kind"] == "bettercompute.io/gpu" and spec["cdiVersion"] == "0.6.0"
        nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
        assert nodes == {GPU_A: ["/dev/nvidia0"], GPU_B: ["/dev/nvidia3"], "alloc-1": ["/dev/nvidia0", "/dev/nvidia3"]}

        async def acknowledged_1() -> bool:
            return await observed(gw, node_id) == 1

        await wait_for(acknowledged_1)

        # A GPU this node does not have: that allocation is left out, and the generation is not acknowledged.
        await push(gw, node_id, 2, {"allocations": [{"id": "alloc-2", "gpus": ["GPU-not-here"]}]})

        async def refused() -> bool:
            return "desired state 2 not acknowledged" in log.read_text()

        await wait_for(refused)
        assert "allocation alloc-2: GPU GPU-not-here is not in this node's inventory" in log.read_text()
        assert not spec_file.exists()  # nothing else was allocated
        assert await observed(gw, node_id) == 1

        # Nothing allocated: the spec is removed.
        await push(gw, node_id, 3, {"allocations": [{"id": "alloc-3", "gpus": [GPU_A]}]})
        await wait_for(written)
        await push(gw, node_id, 4, {"allocations": []})

        async def removed() -> bool:
            return not spec_file.exists()

        await wait_for(removed)

        async def acknowledged() -> bool:
            return await observed(gw, node_id) == 4

        await wait_for(acknowledged)
        assert json.loads((tmp_path / "bcd" / "desired.json").read_text()) == {"allocations": []}
    finally:
        daemon.terminate()
        await daemon.wait()


async def test_a_desired_state_older_than_one_applied_is_refused_across_restarts(
    gw: Wire, tmp_path: Path, database_url: str
) -> None:
    # Whoever sends it (a gateway replaying an old frame, a database put back), a generation older than one this node
    # already acted on is not applied: the CDI spec stays, nothing is acknowledged, and the node reports the refusal.
    inventory = tmp_path / "inventory.json"
    gpus = [{"uuid": GPU_A, "model": "H100", "minor": 0}, {"uuid": GPU_B, "model": "H100", "minor": 3}]
    claims = {"hostname": "gpu-replay", "serial": "SN-REPLAY-1", "product": "PowerEdge XE9680"}
    inventory.write_text(json.dumps({"claims": claims, "sections": {"gpus": gpus}}))
    common = ["--state-dir", str(tmp_path / "bcd"), "--fake-inventory", str(inventory)]
    token = await gw.fleet.token()
    args = shlex.split(token.join_command)[2:]
    args[args.index("--gateway") + 1] = f"127.0.0.1:{gw.port}"
    joined = await anyio.run_process([BCD, *common, "join", *args], check=False)
    assert joined.returncode == 0, joined.stderr.decode()
    node_id = json.loads((tmp_path / "bcd" / "node.json").read_text())["node_id"]
    cdi = tmp_path / "cdi"
    spec_file = cdi / "bettercompute.io-gpu.json"
    log = tmp_path / "bcd.err"

    async def start() -> asyncio.subprocess.Process:
        with log.open("ab") as err:
            return await asyncio.create_subprocess_exec(
                BCD, *common, "node", "--cdi-dir", str(cdi), stdout=asyncio.subprocess.DEVNULL, stderr=err
            )

    def allocated() -> set[str]:
        spec = json.loads(spec_file.read_text()) if spec_file.exists() else {"devices": []}
        return {d["name"] for d in spec["devices"] if d["name"].startswith("alloc-")}

    async def acknowledged(generation: int) -> None:
        async def seen() -> bool:
            return await observed(gw, node_id) == generation

        await wait_for(seen)

    daemon = await start()
    try:

        async def in_session() -> bool:
            return node_id in gw.gateway.sessions

        await wait_for(in_session)
        await push(gw, node_id, 1, {"allocations": [{"id": "alloc-1", "gpus": [GPU_A]}]})
        await acknowledged(1)
        [first] = await gw.fleet.store.repository(NODES).desired_newer([(node_id, 0)])  # as signed, for the replay
        assert first.instruction is not None
        await push(gw, node_id, 2, {"allocations": [{"id": "alloc-2", "gpus": [GPU_B]}]})
        await acknowledged(2)
        assert allocated() == {"alloc-2"}
    finally:
        daemon.terminate()
        await daemon.wait()

    # The node's desired state put back to generation 1 (its old allocation, with the control plane's genuine
    # signature), as a replay would present it: only the daemon's own memory of generation 2 can refuse it.
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            f'UPDATE "{gw.fleet.store.schema}".nodes SET desired_generation = 1, desired_state = %s::jsonb, '
            "desired_text = %s, desired_signature = %s, desired_signer = %s WHERE id = %s",
            (first.text, first.text, first.instruction.signature, first.instruction.signer, node_id),
        )
    daemon = await start()
    try:

        async def reported() -> bool:
            events = await gw.fleet.events("node.reported")
            return any(p["type"] == "desired_state.refused" for k, p in events if k == node_id)

        await wait_for(reported)
        [refusal] = [p for k, p in await gw.fleet.events("node.reported") if p["type"] == "desired_state.refused"]
        assert refusal["payload"] == {"generation": 1, "applied_generation": 2, "reason": "older"}
        assert "desired state 1 refused: generation 2 was already applied" in log.read_text()
        assert allocated() == {"alloc-2"}  # the CDI spec of generation 2 stands
        assert await observed(gw, node_id) == 2  # and generation 1 was not acknowledged
    finally:
        daemon.terminate()
        await daemon.wait()
