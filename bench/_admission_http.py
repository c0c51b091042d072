"""(1) of ``bench/admission.py``: the ``serve --roles api`` process, the load client run against it (a process of
its own, ``_admission_client``), the saturation and half-load runs, and the api under cProfile."""

from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from bench import _admission_setup as base
from bench._admission_setup import (
    BIN,
    GPUS_PER_NODE,
    PAST,
    START_TIMEOUT,
    Placing,
    Setup,
    connect,
    counting_env,
    cpu_seconds,
    free_port,
    function_calls,
    machine_ticks,
    percentile,
    placing_since,
    reset_runs,
)

CLIENT = Path(__file__).with_name("_admission_client.py")
OPEN_LOOP_CONNECTIONS = 64  # callers of the rate-limited run: enough that none is ever waited for at half load


@attrs.define(kw_only=True, eq=False)
class Api:
    """The ``serve --roles api`` process, its stderr in a file."""

    popen: subprocess.Popen[bytes]
    log: Path
    port: int

    @classmethod
    def start(cls, setup: Setup, *, profile: Path | None) -> Api:
        port = free_port()
        log = setup.folder / f"api-{port}.log"
        command = [str(BIN / "better-compute")]
        if profile is not None:  # the console script is a Python file: run it under cProfile
            command = [sys.executable, "-m", "cProfile", "-o", str(profile), command[0]]
        command += ["--config", str(setup.config), "serve", "--roles", "api", "--no-migrate", "--port", str(port)]
        env = {**counting_env(), "BETTERCOMPUTE_INSTANCE": "bench-api"}
        with log.open("wb") as err:
            popen = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        api = cls(popen=popen, log=log, port=port)
        deadline = time.monotonic() + START_TIMEOUT
        while "serving " not in log.read_text(errors="replace"):
            if popen.poll() is not None or time.monotonic() > deadline:
                api.stop()
                raise SystemExit(f"the api process did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        return api

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self) -> None:
        """SIGTERM (a clean exit, which also writes cProfile's file), then SIGKILL after 30 s."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@attrs.frozen(kw_only=True)
class HttpRun:
    """One run of the client: answers by status, latencies (seconds) of the ``200`` ones and of the ``503`` ones
    (``shed``, for bench/shedding.py; sorted, at most 1,000 evenly spaced ranks), the window, and the CPU of the api
    process, of the client and the machine's busy share over the window."""

    label: str
    ok: int
    failed: dict[str, int]
    seconds: float
    latencies: list[float]
    shed: list[float]
    api_cpu: float
    client_cpu: float
    busy: float
    target_rate: float | None
    placing: Placing

    @property
    def rate(self) -> float:
        return self.ok / self.seconds

    def ms(self, q: float) -> float:
        return 1000 * percentile(self.latencies, q) if self.latencies else float("nan")


def request_bytes(setup: Setup, port: int, gpus: int) -> bytes:
    body = json.dumps(
        {"tenant": setup.tenant, "pool_id": setup.pool, "gpus": gpus, "duration": "PT1H"}, separators=(",", ":")
    ).encode()
    head = (
        f"POST /api/compute/reservations/create HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {setup.credential}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
    )
    return head.encode() + b"%KEY%\r\n" + body


def run_client(api: Api, config: Mapping[str, Any], label: str) -> HttpRun:
    """Run the client process with ``config``; the api's CPU and the machine's over its measured window."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
        path = f.name
    counted = function_calls()
    try:
        client = subprocess.Popen(
            [sys.executable, str(CLIENT), path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdout is not None and client.stdin is not None
        # The client says when its window starts and ends, so the api's CPU is read over the same window.
        marks: dict[str, tuple[float, float, int, int]] = {}
        result: dict[str, Any] | None = None
        for line in client.stdout:
            message = json.loads(line)
            if "mark" in message:
                busy, total = machine_ticks()
                marks[message["mark"]] = (cpu_seconds(api.pid), cpu_seconds(client.pid), busy, total)
            else:
                result = message
        client.wait()
    finally:
        os.unlink(path)
    if result is None or client.returncode != 0:
        raise SystemExit(f"the client failed (exit {client.returncode})")
    start, end = marks["start"], marks["end"]
    seconds = float(result["seconds"])
    return HttpRun(
        label=label,
        ok=int(result["ok"]),
        failed=dict(result["failed"]),
        seconds=seconds,
        latencies=[float(x) for x in result["latencies"]],
        shed=[float(x) for x in result["shed"]],
        api_cpu=(end[0] - start[0]) / seconds,
        client_cpu=(end[1] - start[1]) / seconds,
        busy=(end[2] - start[2]) / max(1, end[3] - start[3]),
        target_rate=config.get("rate"),
        placing=placing_since(counted),
    )


def bench_http(api: Api, setup: Setup, args: argparse.Namespace, *, with_key: bool) -> tuple[HttpRun, HttpRun]:
    """Saturation, then half that rate; each on an empty pool."""
    base = {
        "port": api.port,
        "request": request_bytes(setup, api.port, args.gpus).decode("latin-1"),
        "with_key": with_key,
        "warmup": args.warmup,
        "seconds": args.seconds,
    }
    tag = "with key" if with_key else "no key"
    reset_runs(setup.pool)
    saturated = run_client(api, {**base, "connections": args.connections}, f"saturation, {tag}")
    check_booked(setup, saturated, args)
    half = saturated.rate / 2
    reset_runs(setup.pool)
    paced = run_client(
        api, {**base, "connections": OPEN_LOOP_CONNECTIONS, "rate": half}, f"half load ({half:.0f}/s), {tag}"
    )
    check_booked(setup, paced, args)
    return saturated, paced


def check_booked(setup: Setup, run: HttpRun, args: argparse.Namespace) -> None:
    """The pool must never have come near running out: a run that did would measure refusals."""
    with connect() as conn:
        row = conn.execute(
            f'SELECT count(*) FROM "{base.SCHEMA}".bookings WHERE pool_id = %s AND reservation_id NOT LIKE %s',
            (setup.pool, PAST + "%"),
        ).fetchone()
    booked = int(row[0]) if row else 0
    if booked > 0.9 * args.nodes * GPUS_PER_NODE:
        raise SystemExit(f"{run.label}: {booked} atoms booked of {args.nodes * GPUS_PER_NODE}: raise --nodes")


def profile_api(setup: Setup, args: argparse.Namespace) -> str:
    """A saturation run against an api process under cProfile; its busiest functions, as text."""
    path = setup.folder / "api.prof"
    api = Api.start(setup, profile=path)
    try:
        bench_http_saturation_only(api, setup, args)
    finally:
        api.stop()
    if not path.exists():
        return "(no profile written: the api process did not exit cleanly)"
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    # Wall time, not CPU: on a busy machine a call that wakes PostgreSQL (a send) may be charged for its run.
    stats.sort_stats("tottime").print_stats(20)
    stats.sort_stats("cumulative").print_stats(r"bettercompute.*(dispatch|_reservations|_iam|http|_db)", 25)
    return out.getvalue()


def bench_http_saturation_only(api: Api, setup: Setup, args: argparse.Namespace) -> HttpRun:
    reset_runs(setup.pool)
    config = {
        "port": api.port,
        "request": request_bytes(setup, api.port, args.gpus).decode("latin-1"),
        "with_key": False,
        "warmup": args.warmup,
        "seconds": args.seconds,
        "connections": args.connections,
    }
    return run_client(api, config, "saturation under cProfile")
