"""``bcd`` as real OS processes against a real gateway: ``bcd join`` exactly as ``join-tokens.create`` prints it
(with the test gateway's address), then ``bcd node``: the session opens, liveness advances, a command comes back
signed, a gateway restart is survived with a new epoch, and revoking the node stops the daemon for good."""

from __future__ import annotations

import asyncio
import json
import shlex
import stat
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from bettercompute.modules.commands import COMMANDS, SESSIONS
from bettercompute.modules.nodes import NODES, RevokeNodeInput
from bettercompute_gateway import create_gateway
from tests._timing import deadline

from .conftest import Wire

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

BCD = str(Path(sys.executable).parent / "bcd")
STOPPED = 3


def fake_inventory(folder: Path, serial: str) -> Path:
    path = folder / f"inventory-{serial}.json"
    path.write_text(
        json.dumps(
            {
                "claims": {"hostname": f"host-{serial.lower()}", "serial": serial, "product": "PowerEdge XE9680"},
                "sections": {"gpus": [{"uuid": "GPU-fake-0", "model": "H100", "memory_mib": 81559}]},
                "health": {"healthy": True, "ecc_uncorrectable": 0},
            }
        )
    )
    return path


async def wait_for(check: Callable[[], Awaitable[bool]], seconds: float = 15) -> None:
    """Poll ``check`` until it holds (the processes give no event to wait on)."""
    with anyio.fail_after(deadline(seconds)):
        while not await check():  # noqa: ASYNC110
            await anyio.sleep(0.1)


async def test_bcd_joins_as_printed_holds_its_session_and_stops_when_revoked(gw: Wire, tmp_path: Path) -> None:
    token = await gw.fleet.token()
    printed = shlex.split(token.join_command)
    assert printed[:2] == ["bcd", "join"]
    printed[printed.index("--gateway") + 1] = f"127.0.0.1:{gw.port}"  # the test's gateway, not the configured one
    state = tmp_path / "bcd"
    inventory = fake_inventory(tmp_path, "SN-PROC-1")
    common = ["--state-dir", str(state), "--fake-inventory", str(inventory)]
    joined = await anyio.run_process([BCD, *common, *printed[1:]], check=False)
    assert joined.returncode == 0, joined.stderr.decode()
    assert b"joined as node_" in joined.stdout
    assert token.token.encode() not in joined.stdout + joined.stderr  # the secret is never printed back
    for name in ("node.key", "node.crt", "config.json", "ca-bundle.pem", "node.json"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    node_id = json.loads((state / "node.json").read_text())["node_id"]
    node = await gw.fleet.store.repository(NODES).get(node_id)
    assert node is not None and node.state == "adopting"

    daemon = await asyncio.create_subprocess_exec(
        BCD, *common, "node", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:

        async def in_session(epoch: int) -> bool:
            return gw.gateway.sessions.get(node_id) == epoch

        await wait_for(lambda: in_session(1))
        first = await gw.fleet.store.repository(SESSIONS).get(node_id)
        assert first is not None

        async def seen_later() -> bool:
            now = await gw.fleet.store.repository(SESSIONS).get(node_id)
            return now is not None and now.last_seen_at > first.last_seen_at

        await wait_for(seen_later)

        command = await gw.fleet.command(node)

        async def finished() -> bool:
            done = await gw.fleet.store.repository(COMMANDS).get(command.id)
            return done is not None and done.state == "succeeded"

        await wait_for(finished)
        done = await gw.fleet.store.repository(COMMANDS).get(command.id)
        assert done is not None and done.result == {"fake": True, "health": {"ecc_uncorrectable": 0, "healthy": True}}

        # The gateway goes away and comes back on the same port: the daemon reconnects with the next epoch.
        port, tls, options = gw.port, gw.gateway._tls, gw.gateway.options
        await gw.gateway.close()
        gw.gateway = create_gateway(gw.fleet.services, gw.fleet.store, tls, options)
        await gw.gateway.start("127.0.0.1", port)
        await wait_for(lambda: in_session(2))

        await gw.fleet.compute.api.nodes.revoke(gw.fleet.alice, RevokeNodeInput(id=node_id))
        with anyio.fail_after(deadline(10)):
            code = await daemon.wait()
        assert code == STOPPED
        stderr = (await daemon.stderr.read()).decode() if daemon.stderr else ""
        assert "revoked" in stderr and "stopping" in stderr
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()
