"""As a new user: ``better-compute dev``, then a pool and a join token through the API, then the printed
``bcd join ...``, then ``bcd node``: the node is listed with a live session, and ``nodes.revoke`` cuts it off and
stops the daemon for good; the gateway's health answers a load balancer, and SIGUSR1 drains it. Every part is a real
process: the control plane, its gateway, the daemon."""

from __future__ import annotations

import base64
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests._timing import deadline

from .conftest import StartCli, dev_with_gateway

BCD = str(Path(sys.executable).parent / "bcd")


def test_dev_then_a_token_then_bcd_join_and_node_then_revoke(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    plane = dev_with_gateway(cli_env, start_cli, tmp_path)
    dev, gateway_port, call, root = plane.dev, plane.gateway_port, plane.call, plane.root_tenant
    # The gateway runs on uvloop (the stdlib loop's TLS buffers cost about four times the memory per daemon).
    assert re.search(rf"gateway \S+ listening on 127\.0\.0\.1:{gateway_port} .*event loop uvloop", dev.stderr)
    pool = call("pools/create", {"tenant": root, "name": "gpus"})
    created = call("join-tokens/create", {"pool_id": pool["id"], "uses": 1, "expires_in_seconds": 600})
    printed = shlex.split(created["join_command"])
    assert printed[:2] == ["bcd", "join"] and printed[printed.index("--gateway") + 1] == f"127.0.0.1:{gateway_port}"

    inventory = tmp_path / "inventory.json"
    claims = {"hostname": "gpu-01", "serial": "SN-E2E-1", "product": "PowerEdge XE9680"}
    inventory.write_text(json.dumps({"claims": claims, "health": {"healthy": True}}))
    common = ["--state-dir", str(tmp_path / "bcd"), "--fake-inventory", str(inventory)]
    joined = subprocess.run(
        [BCD, *common, *printed[1:]], capture_output=True, text=True, timeout=deadline(60), check=False
    )
    assert joined.returncode == 0, joined.stderr
    node_id = json.loads((tmp_path / "bcd" / "node.json").read_text())["node_id"]

    with (tmp_path / "bcd.err").open("w") as err:
        daemon = subprocess.Popen([BCD, *common, "node"], stdout=subprocess.DEVNULL, stderr=err)
    try:
        ends = time.monotonic() + deadline(30)
        while True:
            listed = call("nodes/list", {"tenant": root, "pool_id": pool["id"]})["nodes"]
            [node] = [n for n in listed if n["id"] == node_id]
            if node["session_epoch"] >= 1 and node["last_seen_at"] is not None:
                break
            assert time.monotonic() < ends, f"no live session: {node}"
            time.sleep(0.2)
        assert node["state"] == "adopting" and node["claims"]["serial"] == "SN-E2E-1"

        call("nodes/revoke", {"id": node_id})
        assert daemon.wait(timeout=deadline(15)) == 3  # cut off, and it does not try again
        assert "revoked" in (tmp_path / "bcd.err").read_text()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait(timeout=deadline(10))

    # The gateway's health, as a load balancer asks it; SIGUSR1 drains the gateway and the process goes on.
    bundle = base64.b64decode(printed[printed.index("--ca-bundle") + 1])
    credentials = grpc.ssl_channel_credentials(root_certificates=bundle)
    with grpc.secure_channel(f"localhost:{gateway_port}", credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        ask = health_pb2.HealthCheckRequest(service="")
        assert stub.Check(ask, timeout=deadline(10)).status == health_pb2.HealthCheckResponse.SERVING
        dev.process.send_signal(signal.SIGUSR1)
        ends = time.monotonic() + deadline(15)
        while stub.Check(ask, timeout=deadline(10)).status != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < ends, "the gateway did not drain"
            time.sleep(0.1)
    assert call("system/whoami", {})["tenant_id"] == root  # the API still serves
    assert dev.stop() == 0
    assert "Traceback" not in dev.stderr
