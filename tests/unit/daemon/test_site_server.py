"""``BootServer`` on loopback (its ports chosen by the kernel): a new plan takes effect at once, its files are fetched
in the background; and ``bcd site serve-local`` refuses a plan it cannot read."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from bettercompute_daemon import main
from bettercompute_daemon._site import BootEntry, BootFile, BootPlan, BootRecord, BootServer

pytestmark = pytest.mark.anyio


def boot_file(tmp_path: Path, name: str, content: bytes) -> BootFile:
    (tmp_path / name).write_bytes(content)
    return BootFile(sha256=hashlib.sha256(content).hexdigest(), url=(tmp_path / name).as_uri())


def ramdisk(machine_id: str, mac: str, kernel: BootFile) -> BootPlan:
    return BootPlan(entries=(BootEntry(machine_id=machine_id, macs=(mac,), action="ramdisk", kernel=kernel),))


async def fetch(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\n\r\n".encode())
    response = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def test_a_new_plan_takes_effect_at_once(tmp_path: Path) -> None:
    old, new = boot_file(tmp_path, "old", b"old kernel\n"), boot_file(tmp_path, "new", b"new kernel\n")
    records: list[BootRecord] = []
    server = BootServer(
        interface="lo",
        address="127.0.0.1",
        cache_dir=tmp_path / "cache",
        on_record=records.append,
        http_port=0,
        tftp_port=0,
        dhcp_ports=(0, 0, 68),
        plan=ramdisk("m1", "02:00:00:00:00:01", old),
    )
    try:
        await server.start()
    except PermissionError:
        pytest.skip("SO_BINDTODEVICE needs CAP_NET_RAW on this kernel")
    try:
        port = server.http.port
        assert (await fetch(port, f"/files/{old.sha256}")) == (200, b"old kernel\n")
        server.set_plan(ramdisk("m2", "02:00:00:00:00:02", new))
        for _ in range(100):  # fetched in the background
            if server.cache.path(new.sha256) is not None:
                break
            await asyncio.sleep(0.02)
        assert server.cache.path(new.sha256) is not None
        assert (await fetch(port, f"/files/{old.sha256}"))[0] == 404
        assert (await fetch(port, f"/files/{new.sha256}")) == (200, b"new kernel\n")
        status, script = await fetch(port, "/script?mac=02-00-00-00-00-01")
        assert status == 200 and b"no boot entry" in script
        status, script = await fetch(port, "/script?mac=02-00-00-00-00-02")
        assert new.sha256.encode() in script
    finally:
        await server.stop()
    assert [(r.kind, r.machine_id) for r in records if r.kind == "script"] == [("script", None), ("script", "m2")]


def test_serve_local_refuses_a_plan_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"entries": [{"machine_id": "m1", "macs": ["nope"]}]}))
    argv = ["site", "serve-local", "--interface=lo", "--address=127.0.0.1", f"--plan={plan}", f"--cache={tmp_path}"]
    assert main(argv) == 1
    assert "not a MAC address" in capsys.readouterr().err
    plan.write_text("{")
    assert main(argv) == 1
    assert "JSONDecodeError" in capsys.readouterr().err
