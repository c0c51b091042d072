"""The site's TFTP server: read-only, and only the iPXE binaries (``undionly.kpxe``, ``ipxe.efi``).

A small RFC 1350 server on asyncio, with the blksize and tsize options (RFC 2347-2349) iPXE and PXE ROMs ask for,
rather than ``tftpy``'s server: that one writes uploads into its root unless given a hook to refuse them, runs a
blocking select loop that would need a thread of its own, and has no hook for a transfer that finished, which is
what the chain rule (``_dhcp``) and the boot records need. Each transfer runs on a socket of its own (a fresh port,
as the protocol has it), resends a block after a second without its acknowledgement (five times at most), and
ignores duplicate acknowledgements (no "Sorcerer's Apprentice" resends). A name outside the allowed set is "file
not found" whatever it points at, so there is no path to traverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

__all__ = ["TftpServer"]

log = logging.getLogger("bcd.site")

_RRQ, _WRQ, _DATA, _ACK, _ERROR, _OACK = 1, 2, 3, 4, 5, 6
_NOT_FOUND, _ACCESS, _ILLEGAL = 1, 2, 4
_MAX_BLKSIZE = 1468  # one Ethernet frame: 1500 - IP - UDP - TFTP headers
_MAX_TRANSFERS = 64

Finished = Callable[[str, str, int], None]
"""Told of each complete transfer: the client's IP, the file name and its size."""


def _error(code: int, message: str) -> bytes:
    return struct.pack("!HH", _ERROR, code) + message.encode() + b"\0"


class TftpServer:
    """Serves ``names`` from ``directory`` on ``address``:``port``."""

    def __init__(
        self,
        *,
        address: str,
        directory: Path,
        names: Iterable[str],
        finished: Finished,
        port: int = 69,
        timeout: float = 1.0,
        retries: int = 5,
    ) -> None:
        self.address = address
        self.directory = directory
        self.names = frozenset(names)
        self.port = port
        self.timeout = timeout
        self.retries = retries
        self._finished = finished
        self._transport: asyncio.DatagramTransport | None = None
        self._transfers: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Bind the server's port."""
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(
            lambda: _Listener(self), local_addr=(self.address, self.port)
        )
        self.port = self._transport.get_extra_info("sockname")[1]

    async def stop(self) -> None:
        """Close the port and end the transfers under way."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        for task in list(self._transfers):
            task.cancel()
        for task in list(self._transfers):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def request(self, data: bytes, peer: tuple[str, int]) -> None:
        """One datagram to the server's port: start a transfer, or answer with an error."""
        if self._transport is None:
            return
        try:
            opcode = struct.unpack_from("!H", data)[0]
            fields = data[2:].split(b"\0")
            name, mode = fields[0].decode("ascii"), fields[1].decode("ascii").lower()
            raw = fields[2:-1]  # the packet ends with a zero byte: the last field is empty
            options = {raw[i].decode("ascii").lower(): raw[i + 1].decode("ascii") for i in range(0, len(raw) - 1, 2)}
        except (struct.error, IndexError, UnicodeDecodeError):
            log.debug("dropped a malformed TFTP request from %s", peer[0])
            return
        if opcode == _WRQ:
            self._transport.sendto(_error(_ACCESS, "read-only server"), peer)
            return
        if opcode != _RRQ:
            return
        if mode != "octet":
            self._transport.sendto(_error(_ILLEGAL, "octet mode only"), peer)
            return
        name = name.lstrip("/")
        if name not in self.names or not (self.directory / name).is_file():
            log.debug("TFTP %s asked for %r: not served", peer[0], name[:64])
            self._transport.sendto(_error(_NOT_FOUND, "file not found"), peer)
            return
        if len(self._transfers) >= _MAX_TRANSFERS:
            self._transport.sendto(_error(0, "busy, try again"), peer)
            return
        task = asyncio.ensure_future(self._transfer(name, options, peer))
        self._transfers.add(task)
        task.add_done_callback(self._transfers.discard)

    async def _transfer(self, name: str, options: dict[str, str], peer: tuple[str, int]) -> None:
        try:
            content = (self.directory / name).read_bytes()
        except OSError as exc:
            log.warning("TFTP could not read %s: %s", name, exc)
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=64)
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Session(queue), local_addr=(self.address, 0), remote_addr=peer
        )
        try:
            blksize = 512
            accepted: dict[str, str] = {}
            if "blksize" in options:
                with contextlib.suppress(ValueError):
                    asked = int(options["blksize"])
                    if asked >= 8:
                        blksize = min(asked, _MAX_BLKSIZE)
                        accepted["blksize"] = str(blksize)
            if "tsize" in options:
                accepted["tsize"] = str(len(content))
            if accepted:
                oack = struct.pack("!H", _OACK) + b"".join(
                    k.encode() + b"\0" + v.encode() + b"\0" for k, v in accepted.items()
                )
                if not await self._send(transport, queue, oack, 0, peer):
                    return
            blocks = len(content) // blksize + 1  # a last block shorter than blksize (maybe empty) ends the file
            for number in range(1, blocks + 1):
                chunk = content[(number - 1) * blksize : number * blksize]
                packet = struct.pack("!HH", _DATA, number & 0xFFFF) + chunk
                if not await self._send(transport, queue, packet, number & 0xFFFF, peer):
                    return
            log.info("TFTP sent %s to %s (%d bytes)", name, peer[0], len(content))
            self._finished(peer[0], name, len(content))
        finally:
            transport.close()

    async def _send(
        self,
        transport: asyncio.DatagramTransport,
        queue: asyncio.Queue[bytes],
        packet: bytes,
        block: int,
        peer: tuple[str, int],
    ) -> bool:
        """Send ``packet`` until ``block`` is acknowledged; ``False`` when the client gave up or went silent."""
        for _ in range(self.retries + 1):
            transport.sendto(packet)
            deadline = asyncio.get_running_loop().time() + self.timeout
            while True:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    reply = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if len(reply) < 4:
                    continue
                opcode, number = struct.unpack_from("!HH", reply)
                if opcode == _ERROR:
                    log.debug("TFTP client %s ended the transfer (error %d)", peer[0], number)
                    return False
                if opcode == _ACK and number == block:
                    return True
                # a duplicate or stale acknowledgement: keep waiting, do not resend
        log.debug("TFTP client %s went silent at block %d", peer[0], block)
        return False


class _Listener(asyncio.DatagramProtocol):
    def __init__(self, server: TftpServer) -> None:
        self.server = server

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        try:
            self.server.request(data, (str(addr[0]), int(addr[1])))
        except Exception:
            log.exception("the TFTP server failed on a request")


class _Session(asyncio.DatagramProtocol):
    """One transfer's socket, connected to the client's address and port (the kernel drops anyone else's)."""

    def __init__(self, queue: asyncio.Queue[bytes]) -> None:
        self.queue = queue

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self.queue.put_nowait(data)
