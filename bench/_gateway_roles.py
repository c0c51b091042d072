"""The child processes of ``bench/gateway.py``: the gateway process, and the client processes that hold the nodes'
sessions (that file's docstring says what each does and why so)."""

from __future__ import annotations

import asyncio
import collections
import ctypes
import gc
import json
import logging
import os
import random
import ssl
import struct
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, cast

import attrs
import betterproto2
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import psycopg
import uvloop
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

import bettercompute_proto as wire
from bench._gateway_parts import (
    GATEWAY_NAME,
    INVENTORY,
    OPEN_TIMEOUT,
    SERVER_NAME,
    SESSION_PATH,
    SPARE_FILES,
    Node,
    open_plane,
    raise_open_files,
    reply,
)
from bench._procfs import rss_bytes
from bettercompute.modules.commands import EDGE
from bettercompute.ports import Repository
from bettercompute_gateway import GatewayOptions, create_gateway, issue_tls

__all__ = ["run_role"]


# --- the gateway process ----------------------------------------------------------------------------------------


class StatementCounter:
    """Counts every statement this process sends, by its text: wraps psycopg's ``AsyncCursor.execute``, which the
    store sends each statement through (on its own, in a transaction or in a pipeline)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)  # send to result, summed

    def install(self) -> None:
        original = psycopg.AsyncCursor.execute
        counts, seconds = self.counts, self.seconds

        async def counted(cursor: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            text = query if isinstance(query, str) else repr(query)
            counts[text] += 1
            started = time.perf_counter()
            try:
                return await original(cursor, query, params, **kwargs)
            finally:
                seconds[text] += time.perf_counter() - started

        psycopg.AsyncCursor.execute = counted  # type: ignore[assignment,method-assign]


class GcClock:
    """The CPU time this process's main thread spends in the garbage collector, by generation (``gc.callbacks``
    around each collection, timed by ``time.thread_time``, so that being preempted on a busy machine is not
    counted)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.runs = [0, 0, 0]
        self._started = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: Mapping[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            generation = int(info["generation"])
            self.seconds[generation] += time.thread_time() - self._started
            self.runs[generation] += 1


FLUSH_STATEMENTS: list[tuple[Repository[Any], str, str]] = [
    (EDGE, "_seen", "Edge.seen"),
    (EDGE, "_revoked", "Edge.revoked_among"),
    (EDGE, "_dispatch", "Edge.dispatch"),
    (EDGE, "_desired_since", "Edge.desired_since"),
    (EDGE, "_desired_newer", "Edge.desired_newer"),
]


async def run_gateway(config: Mapping[str, Any]) -> None:
    """The gateway process: say its port on stdout, then answer ``stats`` lines on stdin until stdin closes."""
    counter = StatementCounter()
    counter.install()
    gc_clock = GcClock()
    gc_clock.install()
    folder = Path(config["folder"])
    async with open_plane(folder, pool_size=10, instance=GATEWAY_NAME, migrate=False) as compute:
        store = compute.options.store
        assert store is not None
        services = compute.gateway_services
        tls, _ = await issue_tls(services, name=GATEWAY_NAME, hosts=["127.0.0.1", SERVER_NAME])
        options = GatewayOptions(name=GATEWAY_NAME, heartbeat_interval=float(config["heartbeat"]))
        if config["gc_young"] is not None:
            options = attrs.evolve(options, gc_young_threshold=config["gc_young"] or None)
        gateway = create_gateway(services, store, tls, options)
        # The flush loop's statements get their repository method's name (read from the store's own statements);
        # any other statement is named by its first words.
        labels: dict[str, str] = {}
        for repository, attribute, label in FLUSH_STATEMENTS:
            statement = getattr(store.repository(repository), attribute, None)
            if statement is not None:
                labels[statement.query] = label
        port = await gateway.start("127.0.0.1", 0)
        reply({"port": port, "loop": type(asyncio.get_running_loop()).__module__})
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        try:
            while line := await reader.readline():
                if line.strip() == b"census":  # not part of the figures: what the collector tracks, by type
                    types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
                    top = types.most_common(40)
                    reply({"objects": sum(types.values()), "top": top, "sessions": len(gateway.sessions)})
                elif line.strip() == b"trim":  # not part of the figures: give free heap back to the system
                    ctypes.CDLL("libc.so.6").malloc_trim(0)
                    reply({"rss": rss_bytes(os.getpid())})
                elif line.strip() == b"stats":
                    by_label: collections.Counter[str] = collections.Counter()
                    wall: collections.defaultdict[str, float] = collections.defaultdict(float)
                    for query, count in counter.counts.items():
                        label = labels.get(query) or " ".join(query.split())[:40]
                        by_label[label] += count
                        wall[label] += counter.seconds[query]
                    reply(
                        {
                            "sessions": len(gateway.sessions),
                            "statements": dict(by_label),
                            "statement_seconds": dict(wall),
                            "gc_seconds": gc_clock.seconds,
                            "gc_runs": gc_clock.runs,
                        }
                    )
        finally:
            await gateway.close()


# --- the client processes ---------------------------------------------------------------------------------------


@attrs.define(eq=False)
class ClientStats:
    opened: int = 0
    heartbeats: int = 0
    reports: int = 0  # signed inventory sections sent beside heartbeats (the "reports" phase)
    report_every: int = 0  # in that phase, a signed section with every this many heartbeats of a session
    failed: collections.Counter[str] = attrs.field(factory=collections.Counter)  # why a session did not open
    ended: collections.Counter[str] = attrs.field(factory=collections.Counter)  # why an open session ended
    alive: set[NodeSession] = attrs.field(factory=set)


class NodeSession(asyncio.Protocol):
    """One node's session over its own TLS connection: HTTP/2 by ``h2``, gRPC framing by hand (see the docstring)."""

    def __init__(self, node_id: str, authority: str, stats: ClientStats, key: ec.EllipticCurvePrivateKey) -> None:
        self.node_id = node_id
        self.key = key  # the node's: it signs the inventory section it reports, as bcd does
        self.epoch = 0
        self.authority = authority
        self.stats = stats
        self.welcomed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.welcomed.add_done_callback(_retrieved)  # a connection that failed early is counted, not logged
        self.transport: asyncio.Transport | None = None
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.buffer = bytearray()
        self.interval = 0.0
        self.beats = random.randrange(1 << 16)  # so that the sessions' reports spread over the heartbeats
        self.timer: asyncio.TimerHandle | None = None
        self.ended: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's TLS transport is no asyncio.Transport
        conn = self.conn
        conn.initiate_connection()
        headers = [
            (":method", "POST"),
            (":scheme", "https"),
            (":path", SESSION_PATH),
            (":authority", self.authority),
            ("content-type", "application/grpc+proto"),
            ("te", "trailers"),
        ]
        conn.send_headers(1, headers)
        hello = wire.Hello(node_id=self.node_id, session_nonce=os.urandom(16), software_version="bench")
        self.send(wire.NodeFrame(hello=hello))

    def send(self, frame: wire.NodeFrame) -> None:
        if self.ended is not None or self.transport is None:
            return
        body = bytes(frame)
        try:
            self.conn.send_data(1, struct.pack(">?I", False, len(body)) + body)
        except h2.exceptions.H2Error as exc:  # the gateway stopped reading (its window is full): say so
            self.end(f"send: {type(exc).__name__}")
            return
        self.transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.H2Error as exc:
            self.end(f"http2: {type(exc).__name__}")
            return
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                if event.flow_controlled_length:
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                self.buffer += event.data or b""
                self.take_frames()
            elif isinstance(event, h2.events.TrailersReceived):
                status = dict(event.headers or []).get(b"grpc-status", b"?")
                self.end(f"grpc-status {status.decode(errors='replace')}")
            elif isinstance(event, h2.events.StreamReset | h2.events.ConnectionTerminated):
                self.end(type(event).__name__)
        out = self.conn.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def take_frames(self) -> None:
        while len(self.buffer) >= 5:
            compressed, length = struct.unpack_from(">?I", self.buffer)
            if len(self.buffer) < 5 + length:
                return
            body = bytes(self.buffer[5 : 5 + length])
            del self.buffer[: 5 + length]
            if compressed:
                self.end("compressed frame")
                return
            kind, content = betterproto2.which_one_of(wire.ControlFrame.parse(body), "frame")
            if isinstance(content, wire.Welcome):
                self.epoch = content.epoch
                self.interval = content.heartbeat_interval_ms / 1000
                loop = asyncio.get_running_loop()
                self.timer = loop.call_later(random.uniform(0, self.interval), self.beat)
                if not self.welcomed.done():
                    self.welcomed.set_result(None)
            elif isinstance(content, wire.InventoryRequest):
                self.report()
            elif isinstance(content, wire.Close):
                self.end(f"close: {content.reason}")
            elif kind != "":
                pass  # desired state, commands: none are sent in this bench

    def report(self) -> None:
        """One inventory section signed by the node's key for this session, as ``bcd`` sends it."""
        message = wire.inventory_section_message(section="cpu", content_json=INVENTORY, fake=True, epoch=self.epoch)
        signature = self.key.sign(message, ec.ECDSA(hashes.SHA256()))
        section = wire.InventorySection(
            section="cpu", content_json=INVENTORY, fake=True, epoch=self.epoch, signature=signature
        )
        self.send(wire.NodeFrame(inventory=section))

    def beat(self) -> None:
        if self.ended is not None:
            return
        self.send(wire.NodeFrame(heartbeat=wire.Heartbeat(sent_at_ms=int(time.time() * 1000))))
        self.stats.heartbeats += 1
        self.beats += 1
        every = self.stats.report_every
        if every and self.beats % every == 0:  # the reports phase: a signed section every so many heartbeats
            self.report()
            self.stats.reports += 1
        self.timer = asyncio.get_running_loop().call_later(self.interval, self.beat)

    def end(self, why: str) -> None:
        if self.ended is not None:
            return
        self.ended = why
        if self.timer is not None:
            self.timer.cancel()
        if self.welcomed.done():
            self.stats.ended[why] += 1
            self.stats.alive.discard(self)
        else:
            self.welcomed.set_exception(ConnectionError(why))
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.end("connection lost")


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


def _node_key(pem_path: str) -> ec.EllipticCurvePrivateKey:
    """The node's private key, from the PEM file that holds it with its certificate (read before any session)."""
    key = serialization.load_pem_private_key(Path(pem_path).read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


async def run_client(config: Mapping[str, Any]) -> None:
    """A client process: make every node's TLS context, say ``ready``; on ``connect``, open every session and
    report; on ``stats``, report; stop when stdin closes."""
    nodes = [Node(**n) for n in config["nodes"]]
    port = int(config["port"])
    bundle = config["bundle"]
    contexts = []
    keys = {}
    for node in nodes:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=bundle)
        context.set_alpn_protocols(["h2"])
        context.load_cert_chain(node.pem_path)
        contexts.append(context)
        keys[node.node_id] = _node_key(node.pem_path)
    stats = ClientStats()
    loop = asyncio.get_running_loop()
    authority = f"{SERVER_NAME}:{port}"
    gate = asyncio.Semaphore(int(config["concurrency"]))

    async def open_one(node: Node, context: ssl.SSLContext) -> None:
        async with gate:
            try:
                _, session = await loop.create_connection(
                    lambda: NodeSession(node.node_id, authority, stats, keys[node.node_id]),
                    "127.0.0.1",
                    port,
                    ssl=context,
                    server_hostname=SERVER_NAME,
                    ssl_handshake_timeout=OPEN_TIMEOUT,
                )
                async with asyncio.timeout(OPEN_TIMEOUT):
                    await session.welcomed
            except Exception as exc:
                stats.failed[str(exc) if isinstance(exc, ConnectionError) else type(exc).__name__] += 1
                return
        transport = session.transport
        alpn = transport.get_extra_info("ssl_object").selected_alpn_protocol() if transport is not None else None
        if alpn != "h2":
            stats.failed[f"alpn {alpn}"] += 1
            session.end("alpn")
            return
        stats.opened += 1
        stats.alive.add(session)

    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    reply({"ready": len(nodes)})
    while line := await reader.readline():
        command = line.strip()
        if command == b"connect":
            started = time.time()
            await asyncio.gather(*(open_one(n, c) for n, c in zip(nodes, contexts, strict=True)))
            reply({"opened": stats.opened, "failed": dict(stats.failed), "started": started, "finished": time.time()})
        elif command == b"stats":
            reply(
                {
                    "alive": len(stats.alive),
                    "heartbeats": stats.heartbeats,
                    "reports": stats.reports,
                    "ended": dict(stats.ended),
                }
            )
        elif command.startswith(b"reports "):
            stats.report_every = int(command.split()[1])
            reply({"report_every": stats.report_every})


def run_role(role: str, config_path: str) -> None:
    config = json.loads(Path(config_path).read_text())
    logging.basicConfig(level=logging.WARNING, format=f"{role}: %(levelname)s %(name)s: %(message)s")
    if role == "gateway":
        raise_open_files(int(config.get("files", 0)) or SPARE_FILES)
        main: Callable[[], Coroutine[Any, Any, None]] = lambda: run_gateway(config)  # noqa: E731
        if config["loop"] == "uvloop":
            uvloop.run(main())
        else:
            asyncio.run(main())
    else:
        raise_open_files(len(config["nodes"]) + SPARE_FILES)
        uvloop.run(run_client(config))
