"""The load client of ``bench/admission.py`` and ``bench/shedding.py``, a process of its own: uvloop, raw HTTP/1.1
over keep-alive connections, one per concurrent caller, the request's bytes made once, the answer read by its length.

    python bench/_admission_client.py CONFIG.json

Closed loop (no ``rate``): each caller sends its next request as soon as the last is answered. Open loop (``rate``):
request i is due at the start plus i / rate, whoever sends it, and its latency counts from then. Only requests sent
within the window (after ``warmup``, for ``seconds``) are counted. It prints ``{"mark": "start"}`` and
``{"mark": "end"}`` when the window opens and closes (so the caller reads CPU over the same window), then the result
as one JSON line. It imports nothing of the project, so it starts fast and costs the machine only its own work.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CLIENT_GRACE = 60.0  # seconds a client may run past its window before it gives up

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> int:
    """Send one request and read its answer; its status."""
    writer.write(payload)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"content-length:")
    if at >= 0:
        length = int(lower[at + 15 : lower.index(b"\r\n", at)])
        await reader.readexactly(length)
        return status
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        await reader.readexactly(size + 2)
        if size == 0:
            return status


class Client:
    """One run: the requests to send, the window, and what the answers sent within it were."""

    def __init__(self, config: Mapping[str, Any], started: float) -> None:
        self.template: bytes = str(config["request"]).encode("latin-1")
        self.with_key = bool(config["with_key"])
        rate = config.get("rate")
        self.rate: float | None = None if rate is None else float(rate)
        self.seconds = float(config["seconds"])
        self.started = started
        self.window_start = started + float(config["warmup"])
        self.window_end = self.window_start + self.seconds
        self.prefix = uuid.uuid4().hex[:12]
        self.counter = 0
        self.plain = self.payload() if not self.with_key else b""
        self.ok = 0
        self.failed: dict[str, int] = {}
        self.latencies: list[float] = []
        self.shed: list[float] = []
        self.marked = False
        self.due = 0  # the open loop's next request, its place in the schedule (the callers share it)

    def payload(self) -> bytes:
        """The request; with a key, a fresh ``Idempotency-Key`` each time."""
        self.counter += 1
        key = f"Idempotency-Key: {self.prefix}-{self.counter}\r\n".encode() if self.with_key else b""
        return self.template.replace(b"%KEY%", key)

    def record(self, status: int, sent: float, done: float) -> None:
        if self.window_start <= sent < self.window_end:
            if status == 200:
                self.ok += 1
                self.latencies.append(done - sent)
            else:
                if status == 503:
                    self.shed.append(done - sent)
                self.failed[str(status)] = self.failed.get(str(status), 0) + 1

    async def marker(self) -> None:
        """Say when the window opens and when it closes."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, self.window_start - loop.time()))
        print(json.dumps({"mark": "start"}), flush=True)
        await asyncio.sleep(max(0.0, self.window_end - loop.time()))
        print(json.dumps({"mark": "end"}), flush=True)
        self.marked = True

    async def closed_loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Each caller sends its next request when the last is answered."""
        loop = asyncio.get_running_loop()
        while (sent := loop.time()) < self.window_end:
            status = await exchange(reader, writer, self.plain or self.payload())
            self.record(status, sent, loop.time())

    async def open_loop(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Request i is due at ``started + i / rate``, whoever sends it."""
        loop = asyncio.get_running_loop()
        assert self.rate is not None
        interval = 1.0 / self.rate
        while True:
            at = self.started + self.due * interval
            self.due += 1
            if at >= self.window_end:
                return
            delay = at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            status = await exchange(reader, writer, self.plain or self.payload())
            self.record(status, at, loop.time())

    def result(self) -> dict[str, Any]:
        # Tens of thousands of 503s would make a line too long for the pipe: their distribution, in 1,000 ranks, is
        # enough.
        shed = sorted(self.shed)
        thinned = [shed[len(shed) * i // 1000] for i in range(1000)] if len(shed) > 1000 else shed
        return {
            "ok": self.ok,
            "failed": self.failed,
            "seconds": self.seconds,
            "latencies": self.latencies,
            "shed": thinned,
            "marked": self.marked,
        }


async def open_connections(port: int, count: int) -> list[Connection]:
    pairs = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pairs.append((reader, writer))
    return pairs


async def client_main(config: Mapping[str, Any]) -> dict[str, Any]:
    """Open the connections, run the callers over the window, and say what was answered."""
    pairs = await open_connections(int(config["port"]), int(config["connections"]))
    client = Client(config, asyncio.get_running_loop().time())
    caller = client.closed_loop if client.rate is None else client.open_loop
    marker = asyncio.ensure_future(client.marker())
    await asyncio.gather(*(caller(r, w) for r, w in pairs))
    await marker
    for _, writer in pairs:
        writer.close()
    return client.result()


def main(path: str) -> None:
    import uvloop

    config = json.loads(Path(path).read_text())
    # A server that stops answering must not hang the bench: the whole run has a deadline.
    deadline = float(config["warmup"]) + float(config["seconds"]) + CLIENT_GRACE
    result = uvloop.run(asyncio.wait_for(client_main(config), deadline))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
