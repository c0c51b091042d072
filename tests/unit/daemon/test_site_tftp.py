"""``bcd site``'s TFTP server, with ``tftpy``'s client: the allowed binaries in full (with and without a larger
block size), nothing else, no uploads; a finished transfer is reported."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path

import pytest
import tftpy

from bettercompute_daemon._site._tftp import TftpServer
from tests._timing import deadline

pytestmark = pytest.mark.anyio


@pytest.fixture
def boot_files(tmp_path: Path) -> Path:
    directory = tmp_path / "ipxe"
    directory.mkdir()
    (directory / "undionly.kpxe").write_bytes(os.urandom(70_001))
    (directory / "ipxe.efi").write_bytes(os.urandom(1024))  # a multiple of 512: an empty last block
    (directory / "secret").write_bytes(b"not for the LAN")
    return directory


async def serve(directory: Path) -> tuple[TftpServer, list[tuple[str, str, int]]]:
    finished: list[tuple[str, str, int]] = []
    server = TftpServer(
        address="127.0.0.1",
        port=0,
        directory=directory,
        names=("undionly.kpxe", "ipxe.efi"),
        finished=lambda *args: finished.append(args),
        timeout=0.5,
    )
    await server.start()
    return server, finished


def download(port: int, name: str, target: Path, options: dict[str, int] | None = None) -> None:
    tftpy.TftpClient("127.0.0.1", port, options=options or {}).download(
        name, str(target), timeout=deadline(2), retries=1
    )


async def test_the_binaries_are_sent_whole(boot_files: Path, tmp_path: Path) -> None:
    server, finished = await serve(boot_files)
    try:
        await asyncio.to_thread(download, server.port, "undionly.kpxe", tmp_path / "a")
        await asyncio.to_thread(download, server.port, "/undionly.kpxe", tmp_path / "b", {"blksize": 1428})
        await asyncio.to_thread(download, server.port, "ipxe.efi", tmp_path / "c", {"tsize": 0})
    finally:
        await server.stop()
    assert (tmp_path / "a").read_bytes() == (boot_files / "undionly.kpxe").read_bytes()
    assert (tmp_path / "b").read_bytes() == (boot_files / "undionly.kpxe").read_bytes()
    assert (tmp_path / "c").read_bytes() == (boot_files / "ipxe.efi").read_bytes()
    assert [(ip, name) for ip, name, _ in finished] == [
        ("127.0.0.1", "undionly.kpxe"),
        ("127.0.0.1", "undionly.kpxe"),
        ("127.0.0.1", "ipxe.efi"),
    ]


async def test_nothing_else_is_served(boot_files: Path, tmp_path: Path) -> None:
    server, finished = await serve(boot_files)
    try:
        for name in ("secret", "../ipxe/secret", "/etc/passwd", "undionly.kpxe/../secret", "UNDIONLY.KPXE"):
            with pytest.raises(tftpy.TftpException):
                await asyncio.to_thread(download, server.port, name, tmp_path / "x")
        # A write request and a netascii read get an error packet; garbage gets nothing and breaks nothing.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.settimeout(2)
            for packet, code in (
                (b"\x00\x02undionly.kpxe\x00octet\x00", 2),
                (b"\x00\x01undionly.kpxe\x00netascii\x00", 4),
            ):
                client.sendto(packet, ("127.0.0.1", server.port))
                reply = await asyncio.to_thread(client.recv, 600)
                assert struct.unpack_from("!HH", reply) == (5, code)
            for garbage in (b"", b"\x00", b"\x00\x01", b"\x00\x01\xff\xfe\x00", b"\x00\x09x\x00y\x00"):
                client.sendto(garbage, ("127.0.0.1", server.port))
        await asyncio.to_thread(download, server.port, "ipxe.efi", tmp_path / "y")
    finally:
        await server.stop()
    assert (boot_files / "undionly.kpxe").stat().st_size == 70_001
    assert [name for _, name, _ in finished] == ["ipxe.efi"]
