"""A three-step workflow whose worker is killed (kill -9) in the middle of step 2 finishes on another worker, with
each step's effect applied exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from bettercompute import Options, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests._timing import deadline

from ._flows import CRASHY, FlowsModule

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.e2e]

SCRIPT = Path(__file__).with_name("_flows.py")
TTL = 2.0


def _start(url: str, schema: str, instance: str) -> subprocess.Popen[str]:
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), url, schema, instance, str(TTL)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if not os.environ.get("BC_WORKER_LOGS") else None,
        text=True,
        env=env,
    )


@pytest.fixture
def workers(database_url: str, fresh_schema: str) -> Iterator[dict[str, subprocess.Popen[str]]]:
    # One first, so that the migrations do not race (they would be safe, only slower), then the other two.
    processes = {"w1": _start(database_url, fresh_schema, "w1")}
    try:
        assert processes["w1"].stdout is not None
        assert processes["w1"].stdout.readline().strip() == "ready"
        processes.update({name: _start(database_url, fresh_schema, name) for name in ("w2", "w3")})
        for name in ("w2", "w3"):
            stdout = processes[name].stdout
            assert stdout is not None
            assert stdout.readline().strip() == "ready"
        yield processes
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
            process.wait(timeout=deadline(30))
            if process.stdout is not None:
                process.stdout.close()


def _query(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchall()


async def _wait_for(predicate: Callable[[], bool], within: float, what: str) -> None:
    started = time.monotonic()
    while time.monotonic() - started < deadline(within):
        if predicate():
            return
        await anyio.sleep(0.1)
    raise AssertionError(f"timed out after {within} s waiting for {what}")


async def test_a_workflow_killed_in_step_two_finishes_elsewhere_applying_each_effect_once(
    workers: dict[str, subprocess.Popen[str]], database_url: str, fresh_schema: str
) -> None:
    url, schema = database_url, fresh_schema

    def live_instances() -> set[str]:
        rows = _query(
            url,
            f"""SELECT DISTINCT w.instance FROM "{schema}".leases l
            JOIN "{schema}".workers w ON w.id = l.holder AND w.role = 'controllers'
            WHERE l.name LIKE 'controllers/shard:%%' AND l.expires_at > now()""",
        )
        return {row[0] for row in rows}

    await _wait_for(lambda: live_instances() == set(workers), 30, "every worker holding shards")

    store = PgStore(url, schema=schema, pool_size=2)
    compute = better_compute(
        Options(store=store, iam=EmbeddedIam(), modules=[FlowsModule(workflows=(CRASHY,))], instance="test")
    )
    await compute.initialize(migrate=False)
    try:
        id = await compute.workflows.start("crashy", tenant="t-1", subject="node/7")

        # Step 2 applies its effect in its writes block, then writes this marker (committed on its own) and hangs
        # before the block ends, so its effect is not committed yet: the middle of the step.
        def marker() -> list[tuple[Any, ...]]:
            return _query(url, f'SELECT worker, pid FROM "{schema}".wf_markers WHERE workflow = %s', id)

        await _wait_for(lambda: bool(marker()), 30, "step 2 to start")
        victim, pid = marker()[0]
        assert workers[victim].pid == pid
        running = await compute.workflows.get(id)
        assert (running.state, running.step, running.attempt) == ("running", "two", 1)
        workers[victim].send_signal(signal.SIGKILL)
        workers[victim].wait(timeout=deadline(10))

        # Another worker takes the shard over (one lease TTL) and re-claims the workflow once the dead worker's
        # claim runs out (the engine's pass deadline plus a lease TTL), then runs step 2 again and step 3.
        async def succeeded() -> bool:
            return (await compute.workflows.get(id)).state == "succeeded"

        ends = time.monotonic() + deadline(45)
        while not await succeeded():
            assert time.monotonic() < ends, await compute.workflows.get(id)
            await anyio.sleep(0.2)

        done = await compute.workflows.get(id)
        assert done.data == {"first": 1, "second": 2, "third": 3, "seen": ["first", "second"]}
        effects = _query(url, f'SELECT step, worker FROM "{schema}".wf_effects WHERE workflow = %s ORDER BY id', id)
        assert [step for step, _ in effects] == ["one", "two", "three"]  # each exactly once
        finished_by = dict(effects)
        assert finished_by["two"] != victim  # the killed worker's uncommitted effect is gone; another applied it
        assert finished_by["three"] != victim
        history = await compute.workflows.history(id)
        assert [(e.step, e.attempt, e.outcome) for e in history] == [
            ("one", 1, "next"),
            ("two", 1, "next"),  # the killed attempt left no trace: it resumed as the same attempt
            ("three", 1, "next"),
        ]
    finally:
        await compute.close()

    for name, process in workers.items():
        if name != victim:
            process.send_signal(signal.SIGTERM)
    for name, process in workers.items():
        if name != victim:
            assert process.wait(timeout=deadline(30)) == 0
