"""The site's HTTP server for iPXE: ``/boot.ipxe``, ``/script?mac=..&uuid=..`` and ``/files/<sha256>``.

A deliberately small HTTP/1.1 server on asyncio streams: GET and HEAD only, one request per connection (the
response says ``Connection: close``), a request line and each header line of at most 8 KiB, at most 64 header lines,
and 10 seconds to send them. ``/files/`` serves a file only under the SHA-256 of a file the current plan boots,
fetching it into the cache first when it is not there yet; any other name is 404, so there is no path to traverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import urllib.parse
from collections.abc import Callable

from ._cache import CacheError, FileCache
from ._plan import BootPlan, BootRecord, normalize_mac
from ._script import chain_script, machine_script

__all__ = ["HttpBootServer"]

log = logging.getLogger("bcd.site")

_LINE_LIMIT = 8192
_MAX_HEADERS = 64
_HEAD_TIMEOUT = 10.0
_CHUNK = 64 * 1024
MAX_CLIENTS = 256
"""Connections served at once; one more is answered 503 at once (a LAN flood never exhausts file handles)."""
_DRAIN_TIMEOUT = 60.0
"""How long a client may take to read one chunk of a file before its connection is dropped."""
_FILE = re.compile(r"/files/([0-9a-f]{64})")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}


class _BadRequest(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


class HttpBootServer:
    """Serves iPXE on ``address``:``port``.

    ``plan`` gives the current plan at each request; ``record`` is told of each script served and each file sent in
    full; ``mac_of`` names the MAC behind a client IP when it is known; ``script_asked`` is told the MAC whose script
    was just served (the chain rule starts over for it).
    """

    def __init__(
        self,
        *,
        address: str,
        port: int,
        plan: Callable[[], BootPlan],
        cache: FileCache,
        record: Callable[[BootRecord], None],
        mac_of: Callable[[str], str | None] = lambda ip: None,
        script_asked: Callable[[str], None] = lambda mac: None,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self.address = address
        self.port = port
        self._plan = plan
        self._cache = cache
        self._record = record
        self._mac_of = mac_of
        self._script_asked = script_asked
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._max_clients = max_clients

    @property
    def base_url(self) -> str:
        """``http://<address>:<port>``."""
        return f"http://{self.address}:{self.port}"

    async def start(self) -> None:
        """Listen."""
        self._server = await asyncio.start_server(self._client, self.address, self.port, limit=_LINE_LIMIT)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop the connections."""
        if self._server is not None:
            self._server.close()
            for task in list(self._clients):  # a slow download does not hold up the stop
                task.cancel()
            await self._server.wait_closed()
            self._server = None

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        ip = str(peer[0]) if peer else "?"
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
            task.add_done_callback(self._clients.discard)
        try:
            if len(self._clients) > self._max_clients:
                # Read the request first (briefly): closing on an unread request resets the connection, and the
                # client would not see the answer.
                with contextlib.suppress(TimeoutError, _BadRequest):
                    await asyncio.wait_for(_read_head(reader), 2.0)
                await _respond(writer, 503, b"")
                return
            try:
                method, target = await asyncio.wait_for(_read_head(reader), _HEAD_TIMEOUT)
            except TimeoutError:
                await _respond(writer, 408, b"")
                return
            except _BadRequest as exc:
                await _respond(writer, exc.status, b"")
                return
            await self._route(writer, ip, method, target)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except TimeoutError:
            log.debug("dropped %s: it stopped reading", ip)
        except Exception:
            log.exception("the HTTP server failed on a request from %s", ip)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _route(self, writer: asyncio.StreamWriter, ip: str, method: str, target: str) -> None:
        if method not in ("GET", "HEAD"):
            await _respond(writer, 405, b"", extra=[("Allow", "GET, HEAD")])
            return
        head = method == "HEAD"
        url = urllib.parse.urlsplit(target)
        if url.path == "/boot.ipxe":
            await _respond(writer, 200, chain_script(self.base_url).encode(), head=head)
        elif url.path == "/script":
            await self._script(writer, ip, url.query, head)
        elif match := _FILE.fullmatch(url.path):
            await self._file(writer, ip, match[1], head)
        else:
            await _respond(writer, 404, b"")

    async def _script(self, writer: asyncio.StreamWriter, ip: str, query: str, head: bool) -> None:
        params = urllib.parse.parse_qs(query, max_num_fields=8)
        mac: str | None = None
        with contextlib.suppress(ValueError):
            mac = normalize_mac(params.get("mac", [""])[0])
        if mac is None:
            mac = self._mac_of(ip)
        system_uuid = params.get("uuid", [""])[0][:64] or None
        entry = self._plan().find(mac, system_uuid)
        body = machine_script(entry, self.base_url).encode()
        await _respond(writer, 200, body, head=head)
        if head:
            return
        if mac is not None:
            self._script_asked(mac)
        self._record(
            BootRecord(
                kind="script",
                mac=mac,
                system_uuid=system_uuid,
                machine_id=entry.machine_id if entry is not None else None,
                detail=entry.action if entry is not None else "no entry",
                at=time.time(),
            )
        )

    async def _file(self, writer: asyncio.StreamWriter, ip: str, sha256: str, head: bool) -> None:
        plan = self._plan()
        file = plan.file(sha256)
        if file is None:
            await _respond(writer, 404, b"")
            return
        try:
            path = await self._cache.ensure(file)
        except CacheError as exc:
            log.warning("cannot serve %s: %s", sha256, exc)
            await _respond(writer, 503, b"")
            return
        with path.open("rb") as content:
            size = path.stat().st_size
            await _respond(writer, 200, None, length=size, head=head, content_type="application/octet-stream")
            if head:
                return
            while chunk := content.read(_CHUNK):
                writer.write(chunk)
                await asyncio.wait_for(writer.drain(), _DRAIN_TIMEOUT)
        mac = self._mac_of(ip)
        entry = plan.find(mac)
        self._record(
            BootRecord(
                kind="file",
                mac=mac,
                system_uuid=None,
                machine_id=entry.machine_id if entry is not None else None,
                detail=f"{sha256} ({size} bytes)",
                at=time.time(),
            )
        )


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str]:
    """The method and target of one request, its headers read and checked for size (their content is not used).

    Raises:
        _BadRequest: a malformed or oversized request line or header, an HTTP version other than 1.0 and 1.1.
    """
    line = await _read_line(reader)
    parts = line.split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1].startswith("/"):
        raise _BadRequest(400)
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        raise _BadRequest(505 if version.startswith("HTTP/") else 400)
    for _ in range(_MAX_HEADERS + 1):
        header = await _read_line(reader)
        if not header:
            return method, target
        if ":" not in header:
            raise _BadRequest(400)
    raise _BadRequest(431)


async def _read_line(reader: asyncio.StreamReader) -> str:
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise _BadRequest(431) from None
    except asyncio.IncompleteReadError:
        raise _BadRequest(400) from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise _BadRequest(400) from None
    return text.rstrip("\r\n")


async def _respond(
    writer: asyncio.StreamWriter,
    status: int,
    body: bytes | None,
    *,
    length: int | None = None,
    head: bool = False,
    content_type: str = "text/plain",
    extra: list[tuple[str, str]] | None = None,
) -> None:
    """Write the status line and headers, then ``body`` (unless ``head``); ``body=None`` leaves the body to the
    caller, with ``length`` as its size."""
    size = len(body) if body is not None else (length or 0)
    lines = [
        f"HTTP/1.1 {status} {_REASONS[status]}",
        f"Content-Type: {content_type}",
        f"Content-Length: {size}",
        "Connection: close",
        *(f"{name}: {value}" for name, value in extra or []),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    if body is not None and not head:
        writer.write(body)
    await writer.drain()
