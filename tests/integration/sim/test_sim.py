"""``bcd sim`` as a real OS process against a real gateway and control plane: a fleet joins with one multi-use
token and holds one session per node; the same seed declares the same machines; a second run in the same state
directory joins nothing; dropped sessions come back; bad arguments are refused with exit status 2. The controllers run
through ``jobs.tick()`` (as in ``test_lifecycle``): healthy nodes are adopted, those declaring a fault quarantined."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from bettercompute.modules.commands import COMMANDS
from bettercompute.modules.nodes import NODES, NodeRecord
from tests._timing import deadline

from ..gateway.conftest import Wire

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.e2e]

BCD = str(Path(sys.executable).parent / "bcd")


async def wait_for(check: Callable[[], Awaitable[bool]], seconds: float = 40) -> None:
    """Poll ``check`` until it holds (the process gives no event to wait on)."""
    with anyio.fail_after(deadline(seconds)):
        while not await check():  # noqa: ASYNC110
            await anyio.sleep(0.1)


async def join_flags(gw: Wire, *, uses: int, pool: str | None = None) -> list[str]:
    """``--token ... --gateway ...``: what ``join-tokens.create`` prints, for this test's gateway."""
    token = await gw.fleet.token(uses=uses, pool=pool)
    printed = shlex.split(token.join_command)
    printed[printed.index("--gateway") + 1] = f"127.0.0.1:{gw.port}"
    return printed[2:]


class Sim:
    """A running ``bcd sim``."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def event(self, name: str) -> dict[str, Any]:
        """The next event of that name it prints (run with ``--debug``)."""
        assert self.process.stdout is not None
        while True:
            line = await self.process.stdout.readline()
            assert line, "bcd sim ended its output"
            event: dict[str, Any] = json.loads(line)
            if event["event"] == name:
                return event

    async def stop(self) -> tuple[int, dict[str, Any], str]:
        """SIGTERM; the exit status, the summary and stderr."""
        self.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(deadline(20)):
            out, err = await self.process.communicate()
        lines = out.decode().splitlines()
        summary = json.loads(lines[-1]) if lines else {}
        assert self.process.returncode is not None
        return self.process.returncode, summary, err.decode()


@asynccontextmanager
async def sim(*args: str) -> AsyncIterator[Sim]:
    process = await asyncio.create_subprocess_exec(
        BCD, "sim", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        yield Sim(process)
    finally:
        if process.returncode is None:
            process.kill()
            await process.communicate()


async def nodes_of(gw: Wire, pool: str | None = None) -> list[NodeRecord]:
    records: list[NodeRecord] = await gw.fleet.store.repository(NODES).for_pool(pool or gw.fleet.pool)
    return records


async def all_in_session(gw: Wire, count: int, pool: str | None = None) -> bool:
    nodes = await nodes_of(gw, pool)
    return len(nodes) == count and all(n.id in gw.gateway.sessions for n in nodes)


async def settle(gw: Wire, count: int, seconds: float = 50) -> list[NodeRecord]:
    """Run the controllers (acceptance, adoption) until each of ``count`` nodes is adopted with its desired state
    acknowledged, or quarantined; the nodes then."""
    with anyio.fail_after(deadline(seconds)):
        while True:
            # Work the gateway enqueues is dated by the database: the manual clock keeps up with it.
            gw.fleet.clock.set(max(gw.fleet.clock.now(), dt.datetime.now(dt.UTC)))
            await gw.fleet.compute.jobs.tick({"controllers"})
            nodes = await nodes_of(gw)
            done = [
                n
                for n in nodes
                if n.state == "quarantined" or (n.state == "adopted" and n.observed_generation == n.desired_generation)
            ]
            if len(done) == count:
                return nodes
            await anyio.sleep(0.1)


async def _assert_fake_gpus(gw: Wire, nodes: list[NodeRecord]) -> None:
    """Each node reported eight fake GPUs of the simulated models, with distinct UUIDs; about 5 % unhealthy."""
    uuids: list[str] = []
    unhealthy = 0
    for node in nodes:
        gpus = next(s for s in await gw.fleet.store.repository(NODES).inventory(node.id) if s.section == "gpus")
        assert gpus.fake and len(gpus.content) == 8
        assert {g["model"] for g in gpus.content} <= {
            "NVIDIA H100 80GB HBM3",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA L40S",
        }
        assert [g["uuid"] for g in gpus.content] == list(node.claims["gpu_uuids"])
        uuids += [g["uuid"] for g in gpus.content]
        unhealthy += sum(1 for g in gpus.content if g["ecc"]["volatile"]["uncorrected"])
        for gpu in gpus.content:
            assert set(gpu) >= {"uuid", "model", "memory_mib", "driver_version", "mig", "nvlink_peers", "ecc"}
    assert len(set(uuids)) == 160
    assert unhealthy <= 8  # 5 % of 160 GPUs are unhealthy, some by ECC, the others by XID 79


async def _assert_diag_answers(gw: Wire, nodes: list[NodeRecord]) -> None:
    """diag.nvml on every node: answered, signed by each node's key (the gateway checks), with the declared health;
    exactly two nodes (10 %) fail acceptance, plus those with an unhealthy GPU."""
    commands = [await gw.fleet.command(node) for node in nodes]

    async def answered() -> bool:
        done = [await gw.fleet.store.repository(COMMANDS).get(c.id) for c in commands]
        return all(d is not None and d.state == "succeeded" for d in done)

    await wait_for(answered)
    results = [await gw.fleet.store.repository(COMMANDS).get(c.id) for c in commands]
    healths = [r.result["health"] for r in results if r is not None and r.result is not None]
    assert len(healths) == 20 and all(r is not None and r.result and r.result["fake"] is True for r in results)
    assert all(h["source"] == "nvml" and len(h["gpus"]) == 8 for h in healths)
    problems = [p for h in healths for g in h["gpus"] for p in g["problems"]]
    assert set(problems) == {"ecc_uncorrectable", "xid_79"}
    # 8 unhealthy GPUs (5 % of 160), plus the first GPU of the 2 nodes that fail acceptance (unless one of them
    # was unhealthy already)
    assert 8 <= sum(1 for h in healths for g in h["gpus"] if g["problems"]) <= 10
    assert sum(1 for h in healths if not h["healthy"]) >= 2


async def _judged_as_declared(gw: Wire, state: Path) -> list[NodeRecord]:
    """The lifecycle controller judges the nodes as it judges real machines: those whose declared health has a
    problem (an unhealthy GPU, or a failed acceptance) are quarantined, the others adopted with generation 1. The
    adopted nodes."""
    declared_unhealthy = set()
    for index in range(20):
        declared = json.loads((state / str(index) / "inventory.json").read_text())
        if not declared["health"]["healthy"]:
            declared_unhealthy.add(json.loads((state / str(index) / "node.json").read_text())["node_id"])
    assert len(declared_unhealthy) >= 2
    settled = await settle(gw, 20)
    assert {n.id for n in settled if n.state == "quarantined"} == declared_unhealthy
    adopted = [n for n in settled if n.state == "adopted"]
    assert adopted and all(n.desired_generation == n.observed_generation == 1 for n in adopted)
    return adopted


def _assert_summary(summary: dict[str, Any], stderr: str, *, adopted: int) -> None:
    """The fleet's summary line on stop: twenty joined, none refused, their sessions, commands and reports counted."""
    assert summary["event"] == "summary" and summary["nodes"] == 20
    assert summary["joined"] == 20 and summary["reused"] == 0 and summary["join_refused"] == 0
    assert summary["sessions_open"] == 20 and summary["commands"] >= 40 and summary["inventory_reports"] >= 20
    assert summary["acks"] >= adopted
    assert "Traceback" not in stderr


async def test_a_fleet_joins_with_one_token_holds_its_sessions_and_answers_as_nodes_do(
    gw: Wire, tmp_path: Path
) -> None:
    flags = await join_flags(gw, uses=20)
    state = tmp_path / "fleet"
    args = ["--nodes", "20", "--seed", "3", "--state-dir", str(state), "--unhealthy", "0.05"]
    async with sim(*args, "--fail-acceptance", "0.1", *flags) as running:
        await wait_for(lambda: all_in_session(gw, 20))
        nodes = await nodes_of(gw)
        assert len({n.id for n in nodes}) == 20 and all(n.state == "adopting" for n in nodes)
        assert len({n.hardware_key for n in nodes}) == 20  # twenty machines, not one joined twenty times

        async def inventories() -> bool:
            sections = [await gw.fleet.store.repository(NODES).inventory(n.id) for n in nodes]
            return all({s.section for s in found} >= {"gpus", "cpu", "memory"} for found in sections)

        await wait_for(inventories)
        await _assert_fake_gpus(gw, nodes)
        await _assert_diag_answers(gw, nodes)
        adopted = await _judged_as_declared(gw, state)

        code, summary, stderr = await running.stop()
    assert code == 0, stderr
    _assert_summary(summary, stderr, adopted=len(adopted))
    for index in range(20):
        assert (state / str(index) / "node.crt").exists() and (state / str(index) / "inventory.json").exists()
        assert not (state / str(index) / "desired.json").exists()  # a simulated node writes nothing for it


async def test_the_same_seed_declares_the_same_machines_and_another_seed_others(gw: Wire, tmp_path: Path) -> None:
    async def declared(seed: int, name: str) -> list[dict[str, Any]]:
        pool = await gw.fleet.new_pool(name)  # the same machines cannot join one pool twice
        flags = await join_flags(gw, uses=3, pool=pool)
        async with sim("--nodes", "3", "--seed", str(seed), "--state-dir", str(tmp_path / name), *flags) as running:
            await wait_for(lambda: all_in_session(gw, 3, pool))
            code, _, stderr = await running.stop()
        assert code == 0, stderr
        nodes = sorted(await nodes_of(gw, pool), key=lambda n: n.claims["hostname"])
        return [dict(n.claims) for n in nodes]

    first, again, other = await declared(11, "first"), await declared(11, "again"), await declared(12, "other")
    assert first == again
    assert [c["hostname"] for c in first] == ["sim11-00000", "sim11-00001", "sim11-00002"]
    assert not {u for c in first for u in c["gpu_uuids"]} & {u for c in other for u in c["gpu_uuids"]}
    assert {c["serial"] for c in first}.isdisjoint({c["serial"] for c in other})
    first_files = [(tmp_path / "first" / str(i) / "inventory.json").read_text() for i in range(3)]
    again_files = [(tmp_path / "again" / str(i) / "inventory.json").read_text() for i in range(3)]
    assert first_files == again_files


async def test_a_second_run_in_the_same_state_directory_joins_nothing(gw: Wire, tmp_path: Path) -> None:
    flags = await join_flags(gw, uses=5)
    state = str(tmp_path / "fleet")
    async with sim("--nodes", "4", "--state-dir", state, *flags) as running:
        await wait_for(lambda: all_in_session(gw, 4))
        code, summary, _ = await running.stop()
    assert code == 0 and summary["joined"] == 4
    first = {n.id: n.session_epoch for n in await nodes_of(gw)}

    # No token, no gateway flag: each node's state directory says where to go.
    async with sim("--nodes", "4", "--state-dir", state) as running:

        async def back() -> bool:
            sessions = gw.gateway.sessions
            return all(sessions.get(node_id, 0) > epoch for node_id, epoch in first.items())

        await wait_for(back)
        code, summary, stderr = await running.stop()
    assert code == 0, stderr
    assert summary["joined"] == 0 and summary["reused"] == 4 and summary["sessions_open"] == 4
    assert {n.id for n in await nodes_of(gw)} == set(first)  # the same four nodes, no new one

    # One node more: it needs a token, and joins where the others did.
    refused = await anyio.run_process([BCD, "sim", "--nodes", "5", "--state-dir", state], check=False)
    assert refused.returncode == 2
    assert "--token: 1 of the 5 nodes have not joined yet" in refused.stderr.decode()
    token = await gw.fleet.token()
    async with sim("--nodes", "5", "--state-dir", state, "--token", token.token) as running:
        await wait_for(lambda: all_in_session(gw, 5))
        code, summary, stderr = await running.stop()
    assert code == 0, stderr
    assert summary["joined"] == 1 and summary["reused"] == 4

    # A node whose state is spoiled stops alone; the others hold their sessions.
    (tmp_path / "fleet" / "2" / "node.crt").write_text("not a certificate")
    async with sim("--nodes", "5", "--state-dir", state) as running:
        spoiled = json.loads((tmp_path / "fleet" / "2" / "node.json").read_text())["node_id"]

        async def others() -> bool:
            live = {n.id for n in await nodes_of(gw)} & set(gw.gateway.sessions)
            return len(live) == 4 and spoiled not in live

        await wait_for(others)
        code, summary, stderr = await running.stop()
    assert code == 0, stderr
    assert summary["failed"] == 1 and summary["sessions_open"] == 4
    assert "node 2 stopped: ValueError" in stderr


async def test_dropped_sessions_are_opened_again(gw: Wire, tmp_path: Path) -> None:
    flags = await join_flags(gw, uses=3)
    args = ["--nodes", "3", "--state-dir", str(tmp_path / "fleet"), "--drop-sessions", "30", "--seed", "5"]
    async with sim(*args, *flags) as running:
        await wait_for(lambda: all_in_session(gw, 3))
        nodes = await nodes_of(gw)

        highest: dict[str, int] = {}

        async def reconnected() -> bool:  # every node dropped at least twice and seen back in session each time
            for node_id, epoch in gw.gateway.sessions.items():
                highest[node_id] = max(epoch, highest.get(node_id, 0))
            return all(highest.get(n.id, 0) >= 3 for n in nodes)

        await wait_for(reconnected, seconds=90)  # backoff doubles per short session: 1 s, 2 s, ...
        code, summary, stderr = await running.stop()
    assert code == 0, stderr
    assert summary["drops"] >= 6 and summary["reconnects"] >= 6
    assert summary["sessions_opened"] == summary["reconnects"] + 3


async def test_a_delayed_ack_leaves_the_desired_state_pending(gw: Wire, tmp_path: Path) -> None:
    flags = await join_flags(gw, uses=2)
    args = ["--nodes", "2", "--state-dir", str(tmp_path / "fleet"), "--ack-delay", "3600", "--debug"]
    async with sim(*args, *flags) as running:
        await wait_for(lambda: all_in_session(gw, 2))
        with anyio.fail_after(deadline(40)):
            while not all(n.state == "adopted" for n in await nodes_of(gw)):
                gw.fleet.clock.set(max(gw.fleet.clock.now(), dt.datetime.now(dt.UTC)))
                await gw.fleet.compute.jobs.tick({"controllers"})
                await anyio.sleep(0.1)
        # Adopted, generation 1 given and pushed; the nodes hold their acknowledgement back.
        with anyio.fail_after(deadline(30)):
            received = {(await running.event("desired_state"))["node"] for _ in range(2)}
        assert received == {0, 1}
        nodes = await nodes_of(gw)
        assert all(n.desired_generation == 1 and n.observed_generation == 0 for n in nodes)
        code, summary, stderr = await running.stop()
    assert code == 0, stderr
    assert summary["desired_states"] == 2 and summary["acks"] == 0  # received, and held back
    assert summary["commands"] >= 2  # the acceptance checks were answered all the same


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--nodes", "0"], "--nodes: must be from 1 to 100000, not 0"),
        (["--nodes", "many"], "--nodes: not a whole number: 'many'"),
        (["--nodes", "2", "--unhealthy", "1.5"], "--unhealthy: must be from 0 to 1, not 1.5"),
        (["--nodes", "2", "--drop-sessions", "-1"], "--drop-sessions: must be at least 0, not -1"),
        (["--nodes", "2", "--fail-acceptance", "nan"], "--fail-acceptance: must be from 0 to 1, not nan"),
        (["--nodes", "2", "--token", "bcjt_x.y"], "gateway: missing"),
        (["--nodes", "2"], "gateway: missing"),
    ],
)
async def test_bad_arguments_are_refused_with_exit_status_2(tmp_path: Path, args: list[str], said: str) -> None:
    done = await anyio.run_process([BCD, "sim", "--state-dir", str(tmp_path / "s"), *args], check=False)
    assert done.returncode == 2
    assert said in done.stderr.decode()
    assert b"Traceback" not in done.stderr
    assert not (tmp_path / "s").exists()  # nothing written


async def writes(gw: Wire) -> dict[str, int]:
    """Rows written so far to the tables of inventory (``node_inventory``) and liveness (``sessions``, ``nodes``),
    as PostgreSQL's statistics count them (each backend reports within about a second)."""
    rows = await gw.fleet.store.fetch(
        gw.fleet.store.sql(
            "SELECT relname, n_tup_ins + n_tup_upd AS written FROM pg_stat_user_tables"
            " WHERE schemaname = :schema AND relname IN ('node_inventory', 'sessions', 'nodes')"
        ),
        {"schema": gw.fleet.store.schema},
    )
    return {r.relname: int(r.written) for r in rows}


async def test_two_hundred_nodes_are_adopted_on_one_gateway(gw: Wire, tmp_path: Path) -> None:
    flags = await join_flags(gw, uses=200)
    args = ["--nodes", "200", "--seed", "200", "--state-dir", str(tmp_path / "fleet")]
    async with sim(*args, "--join-concurrency", "8", *flags) as running:
        await wait_for(lambda: all_in_session(gw, 200), seconds=50)
        settled = await settle(gw, 200)
        assert all(n.state == "adopted" and n.observed_generation == 1 for n in settled)
        before, started = await writes(gw), time.monotonic()
        await anyio.sleep(5)  # a report, not an assertion: what the fleet costs the database in steady state
        after, elapsed = await writes(gw), time.monotonic() - started
        rates = {name: round((after.get(name, 0) - before.get(name, 0)) / elapsed, 1) for name in after}
        print(f"200 simulated nodes, rows written per second: {rates}")
        assert len(gw.gateway.sessions) == 200
        code, summary, stderr = await running.stop()
    assert code == 0, stderr
    assert summary["joined"] == 200 and summary["sessions_open"] == 200 and summary["join_refused"] == 0
    assert summary["acks"] >= 200 and summary["desired_states"] >= 200 and summary["commands"] >= 200
