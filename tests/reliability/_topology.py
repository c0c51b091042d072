"""The reliability run's parts, each a real one: its own PostgreSQL server (so restarting it disturbs no other
test), PgBouncer in transaction mode in front of it, a TCP proxy the test controls between one gateway and the
pooler, the control plane as ``better-compute serve`` processes, ``bcd sim`` fleets, and a Prometheus server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from tests._timing import deadline

__all__ = ["BIN", "PartitionProxy", "Proc", "free_port", "prometheus_binary", "start_prometheus", "wait_until"]

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check: Any, within: float, what: str, every: float = 0.2) -> float:
    """Poll ``check()`` until it is true; the seconds it took. Fails the run with ``what`` after
    ``deadline(within)``."""
    started = time.monotonic()
    limit = deadline(within)
    while True:
        if check():
            return time.monotonic() - started
        if time.monotonic() - started > limit:
            raise AssertionError(f"{what}: not within {limit:.0f} s")
        time.sleep(every)


@attrs.define(kw_only=True, eq=False)
class Proc:
    """A child process started from ``argv``, its output in ``folder/<name>.log`` (appended across restarts)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @classmethod
    def make(cls, name: str, argv: Sequence[str], folder: Path, env: Mapping[str, str]) -> Proc:
        return cls(name=name, argv=list(argv), env=dict(env), log=folder / f"{name}.log")

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_log(self, needle: str, within: float, *, occurrence: int = 1) -> None:
        """Until the log holds ``needle`` ``occurrence`` times (a restarted process logs its lines again)."""

        def found() -> bool:
            if not self.alive():
                raise AssertionError(
                    f"{self.name} ended (exit {self.popen and self.popen.returncode}):\n{self.text()[-3000:]}"
                )
            return self.text().count(needle) >= occurrence

        wait_until(found, within, f"{self.name} logging {needle!r}")

    def signal(self, sig: signal.Signals) -> None:
        assert self.popen is not None
        self.popen.send_signal(sig)

    def kill9(self) -> None:
        assert self.popen is not None
        self.popen.kill()
        self.popen.wait()

    def stop(self, within: float = 20) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(signal.SIGCONT)
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(deadline(within))
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


class PartitionProxy:
    """A TCP proxy on loopback, in a thread with its own event loop. ``partition()`` makes it a black hole: bytes
    in flight stay where they are and new connections are accepted but not carried on, as when the network between
    two hosts fails; ``heal()`` lets everything through again."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream = upstream_port
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="partition-proxy", daemon=True)
        self._server: asyncio.Server | None = None

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(deadline(10)):
            raise AssertionError("the TCP proxy did not start")

    def partition(self) -> None:
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        self._loop.call_soon_threadsafe(self._open.set)

    def close(self) -> None:
        async def shut() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)  # their finally blocks close every transport

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._open.set()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_writer: asyncio.StreamWriter | None = None
        try:
            await self._open.wait()
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream)
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        except (ConnectionError, OSError):
            pass
        finally:
            for end in (writer, up_writer):
                if end is not None:
                    end.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._open.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await self._open.wait()  # what arrived while partitioned waits for the heal
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


def prometheus_binary() -> str | None:
    return shutil.which("prometheus") or next(
        (p for p in ("/usr/bin/prometheus", "/usr/sbin/prometheus") if os.access(p, os.X_OK)), None
    )


def start_prometheus(folder: Path, targets: Mapping[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """A Prometheus server scraping ``targets`` (job name -> ``host:port``) every second; its base URL."""
    binary = prometheus_binary()
    assert binary is not None
    port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [address]}]} for job, address in targets.items()
        ],
    }
    # JSON is YAML: no YAML library needed to write the configuration.
    (folder / "prometheus.yml").write_text(json.dumps(config))
    data = folder / "prometheus-data"
    data.mkdir(exist_ok=True)
    with (folder / "prometheus.log").open("ab") as out:
        popen = subprocess.Popen(
            [
                binary,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1d",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return popen, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def stopping(procs: Sequence[Proc]) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in reversed(procs):
            proc.stop()
