"""``bcd site``'s HTTP server, over real sockets: the scripts by MAC and UUID, the files of the plan and nothing else,
and what it does with requests that are not well-formed GETs."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

from bettercompute_daemon._site._cache import FileCache
from bettercompute_daemon._site._http import HttpBootServer
from bettercompute_daemon._site._plan import BootEntry, BootFile, BootPlan, BootRecord

pytestmark = pytest.mark.anyio

KERNEL = b"kernel bytes\n" * 500
INITRD = b"initrd bytes\n"
SYSTEM_UUID = "43d2d280-8090-4ee4-9b8b-873909821459"


@attrs.define
class Site:
    server: HttpBootServer
    records: list[BootRecord]
    kernel: BootFile
    initrd: BootFile
    stray: BootFile
    """A file in the cache that the plan does not boot."""

    async def get(self, raw: bytes) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
        try:
            writer.write(raw)
            await writer.drain()
            response = await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
            await writer.wait_closed()
        head, _, body = response.partition(b"\r\n\r\n")
        return int(head.split(b" ")[1]), body

    async def path(self, path: str) -> tuple[int, bytes]:
        return await self.get(f"GET {path} HTTP/1.1\r\nHost: x\r\nUser-Agent: iPXE/1.0\r\n\r\n".encode())


def boot_file(tmp_path: Path, name: str, content: bytes) -> BootFile:
    (tmp_path / name).write_bytes(content)
    return BootFile(sha256=hashlib.sha256(content).hexdigest(), url=(tmp_path / name).as_uri(), size=len(content))


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[Site]:
    kernel, initrd = boot_file(tmp_path, "kernel", KERNEL), boot_file(tmp_path, "initrd", INITRD)
    stray = boot_file(tmp_path, "stray", b"someone else's\n")
    plan = BootPlan(
        entries=(
            BootEntry(
                machine_id="m1",
                macs=("52:54:00:77:00:11",),
                system_uuid=SYSTEM_UUID,
                action="ramdisk",
                kernel=kernel,
                initrd=initrd,
                cmdline="console=ttyS0",
            ),
        )
    )
    cache = FileCache(tmp_path / "cache")
    await cache.ensure(stray)
    records: list[BootRecord] = []
    server = HttpBootServer(address="127.0.0.1", port=0, plan=lambda: plan, cache=cache, record=records.append)
    await server.start()
    try:
        yield Site(server, records, kernel, initrd, stray)
    finally:
        await server.stop()


async def test_the_chain_script_and_a_machines_script(site: Site) -> None:
    status, body = await site.path("/boot.ipxe")
    assert status == 200 and body.startswith(b"#!ipxe\nchain http://127.0.0.1:")
    status, body = await site.path("/script?mac=52-54-00-77-00-11&uuid=")
    assert status == 200
    assert f"/files/{site.kernel.sha256} initrd=initrd console=ttyS0".encode() in body
    assert f"initrd --name initrd http://127.0.0.1:{site.server.port}/files/{site.initrd.sha256}".encode() in body
    status, by_uuid = await site.path(f"/script?mac=02-00-00-00-00-01&uuid={SYSTEM_UUID.upper()}")
    assert status == 200 and by_uuid == body
    assert [(r.kind, r.mac, r.machine_id) for r in site.records] == [
        ("script", "52:54:00:77:00:11", "m1"),
        ("script", "02:00:00:00:00:01", "m1"),
    ]


async def test_an_unknown_machine_gets_the_default_script(site: Site) -> None:
    for query in ("mac=02-00-00-00-00-02&uuid=", "mac=garbage&uuid=also-garbage", "", "mac=&mac=&uuid=%00"):
        status, body = await site.path(f"/script?{query}")
        assert status == 200 and b"no boot entry" in body and b"/files/" not in body
    assert all(r.machine_id is None and r.detail == "no entry" for r in site.records)


async def test_files_of_the_plan_are_served_whole_and_recorded(site: Site) -> None:
    status, body = await site.path(f"/files/{site.kernel.sha256}")
    assert status == 200 and body == KERNEL
    head_status, head_body = await site.get(f"HEAD /files/{site.initrd.sha256} HTTP/1.0\r\n\r\n".encode())
    assert head_status == 200 and head_body == b""
    assert [(r.kind, r.detail) for r in site.records] == [("file", f"{site.kernel.sha256} ({len(KERNEL)} bytes)")]


async def test_nothing_outside_the_plan_is_served(site: Site) -> None:
    for path in (
        f"/files/{site.stray.sha256}",  # in the cache, but no entry boots it
        "/files/" + "0" * 64,
        "/files/" + site.kernel.sha256.upper(),
        "/files/../../etc/passwd",
        "/files/%2e%2e/%2e%2e/etc/passwd",
        f"/files/{site.kernel.sha256}/../../etc/passwd",
        "/files/",
        "/cache/" + site.kernel.sha256,
        "/",
        "/etc/passwd",
    ):
        assert await site.path(path) == (404, b""), path
    assert site.records == []


async def test_malformed_requests_are_refused(site: Site) -> None:
    cases = [
        (b"GET /boot.ipxe\r\n\r\n", 400),
        (b"GET  /boot.ipxe HTTP/1.1\r\n\r\n", 400),
        (b"GET boot.ipxe HTTP/1.1\r\n\r\n", 400),
        (b"GET http://x/boot.ipxe HTTP/1.1\r\n\r\n", 400),
        (b"GET /boot.ipxe HTTP/2.0\r\n\r\n", 505),
        (b"GET /boot.ipxe SPDY\r\n\r\n", 400),
        (b"\xff\xfe /boot.ipxe HTTP/1.1\r\n\r\n", 400),
        (b"POST /boot.ipxe HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"DELETE /files/x HTTP/1.1\r\n\r\n", 405),
        (b"GET /boot.ipxe HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 431),
        (b"GET /boot.ipxe HTTP/1.1\r\n" + b"X: y\r\n" * 100 + b"\r\n", 431),
        (b"GET /boot.ipxe HTTP/1.1\r\nHost: x", 400),  # the connection ends in the middle of the head
    ]
    for raw, expected in cases:
        if raw.endswith(b"Host: x"):
            reader, writer = await asyncio.open_connection("127.0.0.1", site.server.port)
            writer.write(raw)
            writer.write_eof()
            response = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            await writer.wait_closed()
            assert response.startswith(b"HTTP/1.1 400 "), response
            continue
        status, _ = await site.get(raw)
        assert status == expected, raw[:60]
    # The server still answers afterwards.
    assert (await site.path("/boot.ipxe"))[0] == 200


async def test_connections_past_the_cap_are_answered_503_at_once(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache")
    server = HttpBootServer(
        address="127.0.0.1", port=0, plan=lambda: BootPlan(), cache=cache, record=lambda r: None, max_clients=2
    )
    await server.start()
    idle = []
    try:
        for _ in range(2):  # two clients that say nothing hold their slots
            idle.append(await asyncio.open_connection("127.0.0.1", server.port))
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /boot.ipxe HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        response = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert response.startswith(b"HTTP/1.1 503")
    finally:
        for _, held in idle:
            held.close()
        await server.stop()
