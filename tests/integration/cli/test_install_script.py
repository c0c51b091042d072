"""As an operator: ``better-compute dev``, a pool and a join token, then the token's install script run for real by
``sh`` in a temporary root (``BCD_*`` variables for /etc, /var/lib and the systemd folder; systemctl skipped), then
``bcd node`` started exactly as the installed unit's ``ExecStart`` says: the node is listed with a live session."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bettercompute._version import __version__
from bettercompute.modules.nodes._install import install_script
from tests._timing import deadline

from .conftest import StartCli, dev_with_gateway

pytestmark = pytest.mark.e2e

BCD = str(Path(sys.executable).parent / "bcd")


def test_the_install_script_joins_the_machine_and_installs_a_unit_that_runs(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    plane = dev_with_gateway(cli_env, start_cli, tmp_path)
    dev, gateway_port, call, root_tenant = plane.dev, plane.gateway_port, plane.call, plane.root_tenant
    pool = call("pools/create", {"tenant": root_tenant, "name": "gpus"})
    created = call("join-tokens/create", {"pool_id": pool["id"], "uses": 1, "expires_in_seconds": 600})
    script = created["install_script"]
    assert script.startswith("#!/bin/sh\n") and created["ca_pin"].startswith("sha256:")
    listed = call("join-tokens/list", {"pool_id": pool["id"]})["tokens"]
    assert created["token"] not in json.dumps(listed)  # shown once: not in what is kept

    root = tmp_path / "machine"
    inventory = tmp_path / "inventory.json"
    claims = {"hostname": "gpu-07", "serial": "SN-INSTALL-1", "product": "PowerEdge XE9680"}
    inventory.write_text(json.dumps({"claims": claims, "health": {"healthy": True}}))
    (tmp_path / "install.sh").write_text(script)
    installed = subprocess.run(
        ["/bin/sh", str(tmp_path / "install.sh")],
        env={
            "PATH": os.environ["PATH"],
            "BCD_ETC": str(root / "etc" / "bcd"),
            "BCD_STATE_DIR": str(root / "var" / "lib" / "bcd"),
            "BCD_SYSTEMD_DIR": str(root / "etc" / "systemd" / "system"),
            "BCD_SKIP_SYSTEMCTL": "1",
            "BCD_BIN": BCD,
            "BCD_FAKE_INVENTORY": str(inventory),
        },
        capture_output=True,
        text=True,
        timeout=deadline(60),
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    assert "joined as node_" in installed.stdout and "systemctl skipped" in installed.stderr
    assert created["token"] not in installed.stdout + installed.stderr

    config = root / "etc" / "bcd" / "join.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert json.loads(config.read_text()) == {
        "gateway": f"127.0.0.1:{gateway_port}",
        "trust_domain": "dev.localhost",
        "pool": pool["id"],
        "join_key": created["short_join_command"].split("--join-key=")[1].split()[0],
        "ca_pin": created["ca_pin"],
    }
    state = root / "var" / "lib" / "bcd"
    node_id = json.loads((state / "node.json").read_text())["node_id"]
    unit = (root / "etc" / "systemd" / "system" / "bcd.service").read_text()
    [exec_start] = [line.removeprefix("ExecStart=") for line in unit.splitlines() if line.startswith("ExecStart=")]

    with (tmp_path / "bcd.err").open("w") as err:
        daemon = subprocess.Popen(shlex.split(exec_start), stdout=subprocess.DEVNULL, stderr=err)
    try:
        ends = time.monotonic() + deadline(30)
        while True:
            [node] = [n for n in call("nodes/list", {"tenant": root_tenant, "pool_id": pool["id"]})["nodes"]]
            if node["session_epoch"] >= 1 and node["last_seen_at"] is not None:
                break
            assert time.monotonic() < ends, f"no live session: {node}"
            time.sleep(0.2)
        assert node["id"] == node_id and node["claims"]["serial"] == "SN-INSTALL-1"
    finally:
        daemon.terminate()
        daemon.wait(timeout=deadline(10))
    assert dev.stop() == 0
    assert "Traceback" not in dev.stderr


def test_without_bcd_the_script_installs_this_version_with_pip(tmp_path: Path) -> None:
    """No ``bcd`` on the machine: the script makes a virtual environment and pip-installs
    ``bettercompute[daemon,nvml]`` of the control plane's version (from a wheel of this tree: pip's own
    ``PIP_FIND_LINKS``, as an operator's mirror would be; the dependencies from the configured index), links it, and
    the installed ``bcd`` writes the unit and runs the join."""
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(Path(__file__).parents[3])],
        capture_output=True,
        text=True,
        timeout=deadline(300),
        check=False,
    )
    assert built.returncode == 0, built.stderr
    tools = tmp_path / "tools"  # a python3 and the system's commands, no bcd
    tools.mkdir()
    (tools / "python3").symlink_to(getattr(sys, "_base_executable", sys.executable))
    script = install_script(
        token="bcjt_x", gateway="127.0.0.1:1", trust_domain="example.com", pool_id=None, join_key="A" * 43,
        ca_pin="sha256:" + "0" * 64,
    )  # fmt: skip
    (tmp_path / "install.sh").write_text(script)
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"claims": {"hostname": "h", "serial": "SN-PIP-1"}}))
    root = tmp_path / "machine"
    done = subprocess.run(
        ["/bin/sh", str(tmp_path / "install.sh")],
        env={
            "PATH": f"{tools}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "PIP_FIND_LINKS": str(wheels),
            "BCD_ETC": str(root / "etc" / "bcd"),
            "BCD_STATE_DIR": str(root / "var" / "lib" / "bcd"),
            "BCD_SYSTEMD_DIR": str(root / "etc" / "systemd" / "system"),
            "BCD_VENV": str(root / "opt" / "bcd"),
            "BCD_BIN_DIR": str(root / "usr" / "local" / "bin"),
            "BCD_SKIP_SYSTEMCTL": "1",
            "BCD_FAKE_INVENTORY": str(inventory),
        },
        capture_output=True,
        text=True,
        timeout=deadline(600),
        check=False,
    )
    installed = root / "opt" / "bcd" / "bin" / "bcd"
    assert f"installing bcd {__version__} into {root}/opt/bcd" in done.stderr, done.stderr
    assert (root / "usr" / "local" / "bin" / "bcd").resolve() == installed.resolve()
    version = subprocess.run(
        [str(installed), "--version"], capture_output=True, text=True, timeout=deadline(60), check=True
    )
    assert version.stdout.strip() == f"bcd {__version__}"
    unit = (root / "etc" / "systemd" / "system" / "bcd.service").read_text()
    assert f"ExecStart={installed} --state-dir {root}/var/lib/bcd" in unit
    # The installed bcd ran the join: nothing listens on port 1.
    assert done.returncode == 1 and "the gateway 127.0.0.1:1 could not be reached" in done.stderr
