"""``bcd ramdisk`` from join to reboot against the stand-in control plane: it joins with the token over TLS, works
over mutual TLS with the certificate it got, signs every report (the stand-in verifies each over the exact bytes),
and reboots only once a deploy succeeded; ``bcd site join`` and ``SiteSync`` over the same wire."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bettercompute_daemon._call import CallError
from bettercompute_daemon._disks import MIB, declared_disks
from bettercompute_daemon._inventory import Inventory
from bettercompute_daemon._ramdisk import Machine, Ramdisk, RamdiskSettings
from bettercompute_daemon._site_client import MAX_RECORDS, SiteSync, site_join
from tests.unit.daemon._http import serve

from ._plane import MACHINE_ID, RAMDISK_TOKEN, SITE_ID, SITE_TOKEN, TRUST_DOMAIN, Running, start, stop

pytestmark = pytest.mark.anyio

BCD = str(Path(sys.executable).parent / "bcd")
IMAGE = os.urandom(MIB + 7)
DIGEST = hashlib.sha256(IMAGE).hexdigest()


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Running]:
    running = await start(tmp_path)
    try:
        yield running
    finally:
        await stop(running)


def inventory_file(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.json"
    path.write_text(
        json.dumps(
            {
                "claims": {"hostname": "m1", "serial": "SN-1", "system_uuid": "4C4C4544-0001", "product": "R760"},
                "sections": {"gpus": [{"uuid": "GPU-1"}]},
            }
        )
    )
    return path


def tasks(disk: Path, base: str) -> list[dict[str, Any]]:
    return [
        {"task_id": "task_1", "kind": "diagnose", "params": {}},
        {"task_id": "task_2", "kind": "wipe", "params": {"disks": [str(disk)]}},
        {
            "task_id": "task_3",
            "kind": "deploy",
            "params": {
                "disk": str(disk),
                "image": {"url": f"{base}/image.raw", "sha256": DIGEST, "size": len(IMAGE)},
                "cloud_init": {"user_data": "#cloud-config\n", "meta_data": "instance-id: m1\n"},
            },
        },
    ]


async def no_wait(seconds: float) -> None:
    await asyncio.sleep(0)


async def test_commission_and_deploy_then_reboot(plane: Running, tmp_path: Path) -> None:
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"\xaa" * (3 * MIB))
    marker = tmp_path / "rebooted"
    settings = RamdiskSettings(
        token=RAMDISK_TOKEN, gateway=plane.gateway, ca_pin=None, ca_bundle_pem=plane.plane.ca.pem
    )
    machine = Machine(Inventory.load(inventory_file(tmp_path)), disks=declared_disks([disk]))
    with serve({"/image.raw": IMAGE}) as base:
        plane.plane.tasks = tasks(disk, base)
        status = await Ramdisk(settings, machine, reboot_command=["touch", str(marker)], sleep=no_wait).run()
    assert status == 0 and marker.exists()
    (join,) = plane.plane.joins
    assert join["claims"] == {
        "hostname": "m1",
        "serial": "SN-1",
        "system_uuid": "4c4c4544-0001",
        "product": "R760",
    }
    reports = plane.plane.reports  # each verified by the stand-in against the certificate's key
    assert [(r["task_id"], r["ok"], r["error"]) for r in reports] == [
        ("task_1", True, None),
        ("task_2", True, None),
        ("task_3", True, None),
    ]
    assert reports[0]["result"]["disks"] == [
        {"name": str(disk), "size_bytes": 3 * MIB, "smart": {"supported": False, "passed": None}}
    ]
    assert reports[1]["result"] == {"disks": [{"name": str(disk), "method": "zero-full", "ok": True}]}
    assert reports[2]["result"] == {"disk": str(disk), "written_bytes": len(IMAGE), "sha256": DIGEST}
    content = disk.read_bytes()
    assert content[: len(IMAGE)] == IMAGE and content[len(IMAGE) :] == bytes(3 * MIB - len(IMAGE))
    assert (tmp_path / "cidata" / "meta-data").read_text() == "instance-id: m1\n"
    spiffe = f"spiffe://{TRUST_DOMAIN}/ramdisk/{MACHINE_ID}"
    assert plane.plane.calls == [("ramdisk.join", None)] + [("ramdisk.task", spiffe)] * 4


async def test_done_without_a_deploy_ends_without_rebooting(plane: Running, tmp_path: Path) -> None:
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"\xaa" * 100)
    marker = tmp_path / "rebooted"
    settings = RamdiskSettings(
        token=RAMDISK_TOKEN, gateway=plane.gateway, ca_pin=None, ca_bundle_pem=plane.plane.ca.pem
    )
    machine = Machine(Inventory.load(inventory_file(tmp_path)), disks=declared_disks([disk]))
    plane.plane.tasks = [{"task_id": "task_1", "kind": "diagnose", "params": {}}]
    status = await Ramdisk(settings, machine, reboot_command=["touch", str(marker)], sleep=no_wait).run()
    assert status == 0 and not marker.exists()
    assert [r["task_id"] for r in plane.plane.reports] == ["task_1"]


async def test_a_refused_token_ends_the_ramdisk(plane: Running, tmp_path: Path) -> None:
    settings = RamdiskSettings(
        token="bcrt_wrong.token", gateway=plane.gateway, ca_pin=None, ca_bundle_pem=plane.plane.ca.pem
    )
    machine = Machine(Inventory.load(inventory_file(tmp_path)), disks=[])
    assert await Ramdisk(settings, machine, sleep=no_wait).run() == 1
    assert plane.plane.calls == [("ramdisk.join", None)]


async def test_bcd_ramdisk_reads_the_kernel_command_line(plane: Running, tmp_path: Path) -> None:
    """The command itself, in another process: the gateway from the kernel command line, the bundle from a flag."""
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"\xaa" * (2 * MIB))
    marker = tmp_path / "rebooted"
    cmdline = tmp_path / "cmdline"
    cmdline.write_text(f'BOOT_IMAGE=/vmlinuz "bc.token={RAMDISK_TOKEN}" bc.gateway={plane.gateway} quiet\n')
    with serve({"/image.raw": IMAGE}) as base:
        plane.plane.tasks = tasks(disk, base)
        process = await asyncio.create_subprocess_exec(
            BCD,
            "--fake-inventory",
            str(inventory_file(tmp_path)),
            "ramdisk",
            "--cmdline-file",
            str(cmdline),
            "--ca-bundle",
            plane.bundle_b64,
            "--disk",
            str(disk),
            "--reboot-command",
            f"touch {marker}",
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(process.communicate(), 60)
    log = stderr.decode()
    assert process.returncode == 0, log
    assert marker.exists() and disk.read_bytes()[: len(IMAGE)] == IMAGE
    assert RAMDISK_TOKEN not in log and "secret" not in log
    assert "joined as the ramdisk of machine mach_0001" in log


async def test_a_site_joins_and_syncs(plane: Running, tmp_path: Path) -> None:
    identity = await site_join(
        state_dir=tmp_path, token=SITE_TOKEN, gateway=plane.gateway, bundle_pem=plane.plane.ca.pem
    )
    assert (identity.site_id, identity.tenant, identity.gateway) == (SITE_ID, "tn_1", plane.gateway)
    folder = tmp_path / "site"
    assert sorted(p.name for p in folder.iterdir()) == [
        "ca-bundle.pem",
        "pinned-ca.pem",
        "site.crt",
        "site.json",
        "site.key",
    ]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()} == {0o600}
    record = {"kind": "dhcp", "mac": "aa:bb:cc:dd:ee:ff", "system_uuid": None, "machine_id": None, "detail": "x"}
    async with SiteSync(tmp_path) as first, SiteSync(tmp_path, "agent_standby") as second:
        assert first.agent.startswith("agent_") and first.agent != second.agent
        answer = await first.sync("http://10.0.0.2:8080", [{**record, "at_ms": 1}])
        assert (answer.active, answer.holder, answer.sync_after_ms, answer.lease_ttl_ms) == (
            True,
            first.agent,
            5_000,
            30_000,
        )
        assert answer.plan() == {"generation": 3, "entries": [{"machine_id": MACHINE_ID, "action": "ramdisk"}]}
        standby = await second.sync("http://10.0.0.3:8080", [])
        assert (standby.active, standby.holder, standby.plan()) == (False, first.agent, {})
        with pytest.raises(ValueError, match="at most 500"):
            await first.sync("http://10.0.0.2:8080", [record] * (MAX_RECORDS + 1))
    assert plane.plane.syncs[0] == {
        "agent": first.agent,
        "http_base": "http://10.0.0.2:8080",
        "records": [{**record, "at_ms": 1}],
    }


async def test_bcd_site_join_and_a_refused_token(plane: Running, tmp_path: Path) -> None:
    with pytest.raises(CallError) as raised:
        await site_join(state_dir=tmp_path, token="bcst_bad.x", gateway=plane.gateway, bundle_pem=plane.plane.ca.pem)
    assert (raised.value.code, raised.value.reason) == ("ACCESS_DENIED", "bad_token")
    assert not (tmp_path / "site").exists()
    process = await asyncio.create_subprocess_exec(
        BCD,
        "site",
        "join",
        "--token",
        SITE_TOKEN,
        "--gateway",
        plane.gateway,
        "--ca-bundle",
        plane.bundle_b64,
        "--state-dir",
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, stderr.decode()
    assert stdout.decode().startswith(f"joined as site {SITE_ID}")
    assert json.loads((tmp_path / "site" / "site.json").read_text())["site_id"] == SITE_ID
