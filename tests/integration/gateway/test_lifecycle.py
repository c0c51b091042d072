"""The node lifecycle end to end, with real ``bcd`` processes on a real gateway: a machine joins and becomes
``adopted`` capacity with desired-state generation 1; one whose NVML facts show an uncorrectable ECC error is
``quarantined`` with the reason; a dropped session makes an adopted node ``unreachable`` after the session timeout,
its atoms withdrawn only after the pool's grace, and a reconnect restores it.

The controllers run through ``jobs.tick()`` on the fleet's manual clock, so the timeouts and the grace are crossed by
moving the clock, not by waiting.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shlex
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

import bettercompute_proto as wire
from bettercompute.errors import AccessDeniedError, ConflictError, NotFoundError
from bettercompute.modules.inventory import INVENTORY, GetDeviceInput, ListDevicesInput
from bettercompute.modules.nodes import NODES, CordonNodeInput, GetNodeInput, Node, RequalifyNodeInput
from bettercompute.modules.pools import CreatePoolInput, NodePolicy, UpdatePoolInput
from tests._timing import deadline

from .conftest import Joined, Wire, hello, session_request, signed_ack, signed_section

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

BCD = str(Path(sys.executable).parent / "bcd")

GPUS = [
    {
        "index": 0,
        "minor": 0,
        "uuid": "GPU-{serial}-0",
        "model": "NVIDIA H100 80GB HBM3",
        "memory_mib": 81559,
        "driver_version": "550.54",
    },
    {
        "index": 1,
        "minor": 1,
        "uuid": "GPU-{serial}-1",
        "model": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "driver_version": "550.54",
        "mig": {
            "current": True,
            "pending": False,
            "devices": [
                {"uuid": "MIG-{serial}-1a", "profile": "3g.40gb", "memory_mib": 40192},
                {"uuid": "MIG-{serial}-1b", "profile": "3g.40gb", "memory_mib": 40192},
            ],
        },
        "nvlink_peers": ["GPU-{serial}-0"],
    },
]


def inventory_file(folder: Path, serial: str, health: dict[str, Any]) -> Path:
    gpus = json.loads(json.dumps(GPUS).replace("{serial}", serial))
    path = folder / f"inventory-{serial}.json"
    path.write_text(
        json.dumps(
            {
                "claims": {"hostname": f"host-{serial.lower()}", "serial": serial, "product": "XE9680"},
                "sections": {"gpus": gpus, "nics": [{"name": "eth0", "mac": "02:00:00:00:00:01", "mtu": 9000}]},
                "health": health,
            }
        )
    )
    return path


class Daemon:
    """One ``bcd`` joined to the fleet's pool, run as ``bcd node`` (start, stop, start again)."""

    def __init__(self, gw: Wire, folder: Path, serial: str, health: dict[str, Any]) -> None:
        self.gw = gw
        self.state = folder / f"bcd-{serial}"
        self.common = ["--state-dir", str(self.state), "--fake-inventory", str(inventory_file(folder, serial, health))]
        self.cdi = folder / f"cdi-{serial}"  # the CDI spec of what is allocated on it, never the machine's own
        self.process: asyncio.subprocess.Process | None = None
        self.node_id = ""

    async def join(self) -> str:
        token = await self.gw.fleet.token()
        printed = shlex.split(token.join_command)
        printed[printed.index("--gateway") + 1] = f"127.0.0.1:{self.gw.port}"
        done = await anyio.run_process([BCD, *self.common, *printed[1:]], check=False)
        assert done.returncode == 0, done.stderr.decode()
        self.node_id = json.loads((self.state / "node.json").read_text())["node_id"]
        return self.node_id

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            BCD,
            *self.common,
            "node",
            "--cdi-dir",
            str(self.cdi),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            with anyio.fail_after(deadline(10)):
                await self.process.wait()
        self.process = None


@pytest.fixture
async def daemons(gw: Wire, tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Daemon]]]:
    made: list[Daemon] = []

    async def make(serial: str, health: dict[str, Any] | None = None) -> Daemon:
        daemon = Daemon(gw, tmp_path, serial, health or {"healthy": True, "ecc_uncorrectable": 0})
        await daemon.join()
        await daemon.start()
        made.append(daemon)
        return daemon

    try:
        yield make
    finally:
        for daemon in made:
            if daemon.process is not None and daemon.process.returncode is None:
                daemon.process.kill()
                await daemon.process.wait()


async def node(gw: Wire, node_id: str, *, by: str | None = None) -> Node:
    found: Node = await gw.fleet.compute.api.nodes.get(by or gw.fleet.alice, GetNodeInput(id=node_id))
    return found


async def settle(
    gw: Wire, node_id: str, holds: Callable[[Node], bool], seconds: float = 30, *, by: str | None = None
) -> Node:
    """Run the controllers (and let the gateway and daemon do their part) until the node's view (as ``by`` reads it:
    alice by default) ``holds``."""
    seen = None
    try:
        with anyio.fail_after(deadline(seconds)):
            while True:
                # Work the gateway enqueues is dated by the database: the manual clock keeps up with it.
                gw.fleet.clock.set(max(gw.fleet.clock.now(), dt.datetime.now(dt.UTC)))
                await gw.fleet.compute.jobs.tick({"controllers"})
                seen = await node(gw, node_id, by=by)
                if holds(seen):
                    return seen
                await anyio.sleep(0.1)
    except TimeoutError:
        record = await gw.fleet.store.repository(NODES).get(node_id)
        pytest.fail(f"the node never got there: {seen} (acceptance {record.acceptance if record else None})")


def conditions(seen: Node) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in seen.conditions}


async def atoms(gw: Wire, node_id: str) -> dict[str, tuple[str, str | None]]:
    return {a.ident: (a.state, a.reason) for a in await gw.fleet.store.repository(INVENTORY).atoms(node_id)}


async def test_a_joined_machine_is_adopted_with_generation_1_and_its_gpus_become_atoms(gw: Wire, daemons: Any) -> None:
    daemon = await daemons("SN-ADOPT")
    adopted = await settle(gw, daemon.node_id, lambda n: n.state == "adopted" and not n.desired_state_pending)
    assert (adopted.desired_generation, adopted.observed_generation) == (1, 1)  # pushed, applied and acknowledged
    assert conditions(adopted)["GpuHealthy"] == ("True", "Healthy")
    assert conditions(adopted)["Reachable"] == ("True", "SessionOpen")
    assert conditions(adopted)["EccErrors"][0] == "False"
    # A whole GPU is an atom; a GPU with MIG on is booked by its slices.
    assert await atoms(gw, daemon.node_id) == {
        "GPU-SN-ADOPT-0": ("available", None),
        "GPU-SN-ADOPT-1": ("unavailable", "mig_enabled"),
        "MIG-SN-ADOPT-1a": ("available", None),
        "MIG-SN-ADOPT-1b": ("available", None),
    }
    [(key, payload)] = await gw.fleet.events("node.adopted")
    assert key == daemon.node_id and payload["desired_generation"] == 1

    listed = await gw.fleet.compute.api.devices.list(gw.fleet.alice, ListDevicesInput(tenant=gw.fleet.acme))
    gpus = {d.ident: d for d in listed.devices if d.kind == "gpu"}
    assert gpus["GPU-SN-ADOPT-1"].details["nvlink_peers"] == ["GPU-SN-ADOPT-0"]
    assert [a.profile for a in gpus["GPU-SN-ADOPT-1"].atoms if a.kind == "mig"] == ["3g.40gb", "3g.40gb"]
    assert {d.kind for d in listed.devices} == {"gpu", "nic"}
    one = await gw.fleet.compute.api.devices.get(
        gw.fleet.alice, GetDeviceInput(node_id=daemon.node_id, id=gpus["GPU-SN-ADOPT-0"].id)
    )
    assert one.model == "NVIDIA H100 80GB HBM3" and one.state == "present"
    # Devices are scoped like their node: another tenant's admin sees none of them.
    with pytest.raises(AccessDeniedError):
        await gw.fleet.compute.api.devices.list(gw.fleet.mallory, ListDevicesInput(tenant=gw.fleet.acme))
    with pytest.raises(NotFoundError):  # as for the node itself: another tenant's node does not exist for them
        await gw.fleet.compute.api.devices.get(
            gw.fleet.mallory, GetDeviceInput(node_id=daemon.node_id, id=gpus["GPU-SN-ADOPT-0"].id)
        )


async def test_an_uncorrectable_ecc_error_quarantines_with_the_reason_and_requalify_checks_again(
    gw: Wire, daemons: Any
) -> None:
    # The daemon's verdict says healthy; the NVML fact (2 uncorrectable errors) is what is judged.
    daemon = await daemons("SN-ECC", {"healthy": True, "ecc_uncorrectable": 2})
    quarantined = await settle(gw, daemon.node_id, lambda n: n.state == "quarantined")
    assert quarantined.state_reason == "ecc_uncorrectable"
    assert quarantined.state_detail["check"] == "diag.nvml"
    assert quarantined.state_detail["findings"][0]["value"] == 2
    assert quarantined.state_detail["output"]["health"]["ecc_uncorrectable"] == 2  # the check's output, kept
    assert quarantined.desired_generation == 0  # no desired state for a node that is not capacity
    assert conditions(quarantined)["EccErrors"] == ("True", "EccErrors")
    assert conditions(quarantined)["GpuHealthy"][0] == "False"
    assert set((await atoms(gw, daemon.node_id)).values()) == {("unavailable", "node_quarantined")}
    [(_, event)] = await gw.fleet.events("node.quarantined")
    assert event["reason"] == "ecc_uncorrectable"

    # The pool tolerates a few errors now: requalifying runs the checks again and the node is adopted.
    await gw.fleet.compute.api.pools.update(
        gw.fleet.alice, UpdatePoolInput(id=quarantined.pool_id, node_policy=NodePolicy(max_ecc_uncorrectable=4))
    )
    again = await gw.fleet.compute.api.nodes.requalify(
        gw.fleet.alice, RequalifyNodeInput(id=daemon.node_id, reason="new threshold")
    )
    assert again.state == "adopting"
    adopted = await settle(gw, daemon.node_id, lambda n: n.state == "adopted")
    assert adopted.desired_generation == 1 and adopted.state_reason is None
    requalified = await gw.fleet.events("node.requalifying")
    assert [p["from"] for _, p in requalified] == ["quarantined"]
    audit = await gw.fleet.store.fetch(
        gw.fleet.store.sql("SELECT details FROM {s}.audit WHERE action = 'compute:nodes:requalify'"), {}
    )
    assert [dict(r.details)["reason"] for r in audit] == ["new threshold"]


async def test_a_dropped_session_is_unreachable_after_the_timeout_and_back_on_reconnect(gw: Wire, daemons: Any) -> None:
    fleet = gw.fleet
    daemon = await daemons("SN-DROP")
    adopted = await settle(gw, daemon.node_id, lambda n: n.state == "adopted")
    await fleet.compute.api.pools.update(
        fleet.alice, UpdatePoolInput(id=adopted.pool_id, node_policy=NodePolicy(unreachable_grace_seconds=60))
    )
    before = await atoms(gw, daemon.node_id)
    ids = sorted(a.id for a in await fleet.store.repository(INVENTORY).atoms(daemon.node_id))

    await daemon.stop()
    dropped = await settle(gw, daemon.node_id, lambda n: conditions(n)["Reachable"][0] == "False")
    assert dropped.state == "adopted"  # not before the session timeout

    fleet.clock.advance(fleet.compute.options.session_timeout + dt.timedelta(seconds=5))
    unreachable = await settle(gw, daemon.node_id, lambda n: n.state == "unreachable")
    assert unreachable.state != "failed" and unreachable.unreachable_since is not None
    assert await atoms(gw, daemon.node_id) == before  # within the pool's grace, nothing booked moves

    fleet.clock.advance(dt.timedelta(seconds=61))
    await settle(gw, daemon.node_id, lambda n: n.state == "unreachable")

    async def withdrawn() -> bool:
        await fleet.compute.jobs.tick({"controllers"})
        return set((await atoms(gw, daemon.node_id)).values()) == {("unavailable", "node_unreachable")}

    with anyio.fail_after(deadline(20)):
        while not await withdrawn():  # noqa: ASYNC110 - the controllers run in this loop; there is no event
            await anyio.sleep(0.1)

    fleet.clock.set(dt.datetime.now(dt.UTC))  # the daemon comes back now (its new session is dated by the database)
    await daemon.start()
    back = await settle(gw, daemon.node_id, lambda n: n.state == "adopted" and conditions(n)["Reachable"][0] == "True")
    assert back.unreachable_since is None
    assert await atoms(gw, daemon.node_id) == before
    assert sorted(a.id for a in await fleet.store.repository(INVENTORY).atoms(daemon.node_id)) == ids
    changes = [(p["from"], p["to"]) for _, p in await fleet.events("node.state_changed")]
    assert changes == [("adopted", "unreachable"), ("unreachable", "adopted")]


async def test_cordon_drain_and_uncordon_are_audited_idempotent_and_published(gw: Wire, daemons: Any) -> None:
    fleet = gw.fleet
    daemon = await daemons("SN-CORDON")
    await settle(gw, daemon.node_id, lambda n: n.state == "adopted")
    nodes = fleet.compute.api.nodes
    cordoned = await nodes.cordon(fleet.alice, CordonNodeInput(id=daemon.node_id, reason="rack 4 power work"))
    assert (cordoned.cordoned, cordoned.draining) == (True, False)
    again = await nodes.cordon(fleet.alice, CordonNodeInput(id=daemon.node_id, reason="rack 4 power work"))
    assert again.cordoned
    drained = await nodes.drain(fleet.alice, CordonNodeInput(id=daemon.node_id, reason="decommission"))
    assert (drained.cordoned, drained.draining) == (True, True)
    back = await nodes.uncordon(fleet.alice, CordonNodeInput(id=daemon.node_id))
    assert (back.cordoned, back.draining) == (False, False)
    events = [p["draining"] for _, p in await fleet.events("node.cordoned")]
    assert events == [False, True]  # the repeated cordon changed nothing, so published nothing
    assert len(await fleet.events("node.uncordoned")) == 1
    audit = await fleet.store.fetch(
        fleet.store.sql(
            "SELECT action, details FROM {s}.audit WHERE action LIKE 'compute:nodes:%' AND action <> "
            "'compute:nodes:join' ORDER BY id"
        ),
        {},
    )
    assert [(r.action, dict(r.details)["changed"]) for r in audit] == [
        ("compute:nodes:cordon", True),
        ("compute:nodes:cordon", False),
        ("compute:nodes:drain", True),
        ("compute:nodes:uncordon", True),
    ]
    # A node being checked cannot be requalified into a second round; an unreachable one is refused outright.
    record = await fleet.store.repository(NODES).get(daemon.node_id)
    assert record is not None and record.state == "adopted"
    with pytest.raises(NotFoundError):
        await nodes.cordon(fleet.mallory, CordonNodeInput(id=daemon.node_id))
    await daemon.stop()
    fleet.clock.advance(fleet.compute.options.session_timeout + dt.timedelta(seconds=5))
    await settle(gw, daemon.node_id, lambda n: n.state == "unreachable")
    with pytest.raises(ConflictError) as refused:
        await nodes.requalify(fleet.alice, RequalifyNodeInput(id=daemon.node_id))
    assert refused.value.details["reason"] == "wrong_state"


async def _check_sent(gw: Wire, node_id: str) -> None:
    """Run the controllers until the node's acceptance round has begun (its check commands made)."""
    with anyio.fail_after(deadline(30)):
        while True:
            record = await gw.fleet.store.repository(NODES).get(node_id)
            if record is not None and record.acceptance.get("commands"):
                return
            await settle(gw, node_id, lambda n: True)


async def _opened(gw: Wire, stream: Any, joined: Joined) -> int:
    """Wait for the gateway's ``Welcome`` on a session just asked for; the session's epoch."""
    with anyio.fail_after(deadline(30)):
        while True:
            frame = await stream.recv_message()
            assert frame is not None
            if frame.welcome is not None:
                return int(frame.welcome.epoch)


async def _report(gw: Wire, joined: Joined, sections: dict[str, Any], *, ack: int | None = None) -> None:
    """A session as a daemon holds it, reporting ``sections`` (and an ack of ``ack``, when given), then ending."""
    channel = gw.channel(joined)
    try:
        async with session_request(channel) as stream:
            await stream.send_request()
            await stream.send_message(hello(joined.node_id))
            before = len(await gw.fleet.events("node.inventory_reported"))
            epoch = await _opened(gw, stream, joined)
            for name, content in sections.items():
                section = signed_section(joined, name, json.dumps(content), epoch=epoch, fake=True)
                await stream.send_message(wire.NodeFrame(inventory=section))
            if ack is not None:
                await stream.send_message(signed_ack(joined, ack, epoch=epoch))
            with anyio.fail_after(deadline(10)):
                while len(await gw.fleet.events("node.inventory_reported")) < before + len(sections):  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            await stream.end()
    finally:
        channel.close()


async def _devices(gw: Wire, node_id: str) -> dict[str, str]:
    return {d.ident: d.state for d in await gw.fleet.store.repository(INVENTORY).devices(node_id)}


async def test_garbage_sections_a_uuid_two_nodes_claim_and_an_ack_never_sent_disturb_nothing_else(gw: Wire) -> None:
    first, second, third = await gw.join("SN-ONE"), await gw.join("SN-TWO"), await gw.join("SN-THREE")
    await _report(gw, first, {"gpus": [{"uuid": "GPU-shared", "model": "H100"}, {"uuid": "GPU-one", "model": "H100"}]})
    await settle(gw, first.node_id, lambda n: "GpuHealthy" in conditions(n))
    # The second machine reports a UUID the first one holds: a conflict on the second, never a steal.
    await _report(gw, second, {"gpus": [{"uuid": "GPU-shared", "model": "H100"}, {"uuid": "GPU-two", "model": "H100"}]})
    claimed = await settle(gw, second.node_id, lambda n: "GpuHealthy" in conditions(n))
    assert conditions(claimed)["GpuHealthy"] == ("False", "DuplicateUuid")
    assert await _devices(gw, second.node_id) == {"GPU-shared": "conflict", "GPU-two": "present"}
    assert await _devices(gw, first.node_id) == {"GPU-shared": "present", "GPU-one": "present"}
    assert (await atoms(gw, second.node_id))["GPU-shared"] == ("unavailable", "device_conflict")
    shared = await gw.fleet.store.repository(INVENTORY).devices(second.node_id)
    assert next(d for d in shared if d.ident == "GPU-shared").details["claimed_by"] == first.node_id  # same tenant

    # Garbage of every shape: the section is kept as sent, the node says what is wrong, nothing else moves.
    oversized = [{"uuid": f"GPU-x{n}", "model": "H100"} for n in range(65)]
    for garbage in ("garbage", [1, "two", None], [{"model": "no uuid"}], oversized):
        await _report(gw, third, {"gpus": garbage}, ack=7)  # generation 7 was never sent to it
        seen = await settle(gw, third.node_id, lambda n: conditions(n).get("InventoryValid", ("",))[0] == "False")
        assert conditions(seen)["InventoryValid"][1] == "MalformedSection"
        assert seen.observed_generation == 0
    assert len(await _devices(gw, third.node_id)) == 64  # only what could be trusted: the first 64 GPUs
    assert await _devices(gw, first.node_id) == {"GPU-shared": "present", "GPU-one": "present"}
    assert (await node(gw, first.node_id)).state == "adopting"  # not checked yet: it never answered diag.nvml


async def test_a_conflict_across_tenants_names_nothing_of_the_other_tenant(gw: Wire) -> None:
    fleet = gw.fleet
    incumbent = await gw.join("SN-ACME")
    await _report(gw, incumbent, {"gpus": [{"uuid": "GPU-shared", "model": "H100"}]})
    await settle(gw, incumbent.node_id, lambda n: "GpuHealthy" in conditions(n))
    # Another tenant's node reports the same UUID: its own device is in conflict, the incumbent's is untouched.
    theirs = await fleet.compute.api.pools.create(fleet.mallory, CreatePoolInput(tenant=fleet.globex, name="gpus"))
    reporter = await gw.join("SN-GLOBEX", pool=theirs.id, by=fleet.mallory)
    gpus = [{"uuid": "GPU-shared", "model": "H100"}, {"uuid": "GPU-own", "model": "H100"}]
    await _report(gw, reporter, {"gpus": gpus})
    claimed = await settle(gw, reporter.node_id, lambda n: "GpuHealthy" in conditions(n), by=fleet.mallory)
    assert conditions(claimed)["GpuHealthy"] == ("False", "DuplicateUuid")
    assert await _devices(gw, reporter.node_id) == {"GPU-shared": "conflict", "GPU-own": "present"}
    assert await _devices(gw, incumbent.node_id) == {"GPU-shared": "present"}
    # What the reporter's tenant reads says the device is claimed, and by nothing it may know of.
    listed = await fleet.compute.api.devices.list(fleet.mallory, ListDevicesInput(tenant=fleet.globex))
    seen = await fleet.compute.api.nodes.get(fleet.mallory, GetNodeInput(id=reporter.node_id))
    for answer in (listed, seen):
        text = json.dumps(attrs.asdict(answer), default=str)
        assert incumbent.node_id not in text and fleet.acme not in text
    conflict = next(d for d in listed.devices if d.ident == "GPU-shared")
    assert conflict.details.get("claimed_by_another_tenant") is True and "claimed_by" not in conflict.details
    # The reporter is quarantined, every atom of it out of capacity; the incumbent goes on as before.
    stopped = await settle(gw, reporter.node_id, lambda n: n.state == "quarantined", by=fleet.mallory)
    assert stopped.state_reason == "duplicate_device" and stopped.state_detail == {
        "devices": ["GPU-shared"],
        "count": 1,
    }
    assert (await atoms(gw, reporter.node_id))["GPU-own"] == ("unavailable", "node_quarantined")
    assert (await node(gw, incumbent.node_id)).state == "adopting"
    assert (await atoms(gw, incumbent.node_id))["GPU-shared"][1] != "device_conflict"


async def test_a_check_the_daemon_never_answers_or_no_one_provides_quarantines_with_its_reason(gw: Wire) -> None:
    fleet = gw.fleet
    silent = await gw.join("SN-SILENT")
    unknown = await gw.join("SN-UNKNOWN")  # before the clock moves: its certificate is dated by it
    channel = gw.channel(silent)
    try:
        async with session_request(channel) as stream:
            # A daemon that reports its inventory, then never answers the diag.nvml command it is sent.
            await stream.send_request()
            await stream.send_message(hello(silent.node_id))
            gpus = json.dumps([{"uuid": "GPU-silent", "model": "H100"}])
            epoch = await _opened(gw, stream, silent)
            await stream.send_message(wire.NodeFrame(inventory=signed_section(silent, "gpus", gpus, epoch=epoch)))
            waiting = await settle(gw, silent.node_id, lambda n: bool(n.conditions))
            assert waiting.state == "adopting"
            await _check_sent(gw, silent.node_id)  # once the section's signature was checked
            fleet.clock.advance(dt.timedelta(seconds=NodePolicy().check_deadline_seconds + 1))
            late = await settle(gw, silent.node_id, lambda n: n.state == "quarantined")
            assert late.state_reason == "check_deadline_exceeded"
            assert late.state_detail["check"] == "diag.nvml"
            await stream.end()
    finally:
        channel.close()

    # A pool naming a check no module provides: the node is quarantined saying so, rather than waiting forever.
    pool = await fleet.compute.api.pools.update(
        fleet.alice, UpdatePoolInput(id=fleet.pool, acceptance_checks=("diag.nvml", "burn.in"))
    )
    assert pool.acceptance_checks == ("diag.nvml", "burn.in")
    await _report(gw, unknown, {"gpus": [{"uuid": "GPU-unknown", "model": "H100"}]})
    refused = await settle(gw, unknown.node_id, lambda n: n.state == "quarantined")
    assert refused.state_reason == "unknown_check"
    assert refused.state_detail["check"] == "burn.in" and "diag.nvml" in refused.state_detail["known"]


# --- reservations bind through the daemon -----------------------------------------------------------------------


async def reservation(gw: Wire, reservation_id: str) -> Any:
    from bettercompute.modules.reservations import GetReservationInput, ReservationsGroup

    group: ReservationsGroup[Any] = gw.fleet.compute.api.group(ReservationsGroup)
    return await group.get(gw.fleet.alice, GetReservationInput(id=reservation_id))


async def settle_reservation(gw: Wire, reservation_id: str, state: str, seconds: float = 30) -> Any:
    seen = None
    try:
        with anyio.fail_after(deadline(seconds)):
            while True:
                gw.fleet.clock.set(max(gw.fleet.clock.now(), dt.datetime.now(dt.UTC)))
                await gw.fleet.compute.jobs.tick({"controllers"})
                seen = await reservation(gw, reservation_id)
                if seen.state == state:
                    return seen
                await anyio.sleep(0.1)
    except TimeoutError:
        nodes = [await gw.fleet.store.repository(NODES).get(p.node_id) for p in seen.placement] if seen else []
        shown = [(n.id, n.desired_generation, n.observed_generation) for n in nodes if n is not None]
        pytest.fail(f"the reservation never got {state}: {seen} on nodes {shown}")


async def desired(gw: Wire, node_id: str) -> tuple[int, list[Any]]:
    [found] = await gw.fleet.store.repository(NODES).desired_newer([(node_id, -1)])
    return found.generation, list(found.content.get("allocations") or ())


async def test_a_reservation_binds_through_the_daemons_ack_runs_and_ends(gw: Wire, daemons: Any) -> None:
    from bettercompute.modules.reservations import (
        CancelReservationInput,
        Constraints,
        CreateReservationInput,
        ReservationsGroup,
    )

    group: ReservationsGroup[Any] = gw.fleet.compute.api.group(ReservationsGroup)
    daemon = await daemons("SN-RSV")
    adopted = await settle(gw, daemon.node_id, lambda n: n.state == "adopted" and not n.desired_state_pending)
    made = await group.create(
        gw.fleet.alice,
        CreateReservationInput(
            tenant=gw.fleet.acme,
            pool_id=adopted.pool_id,
            gpus=1,
            duration="PT1H",
            constraints=Constraints(model="H100"),
        ),
    )
    assert made.state == "placed"
    assert [(p.node_id, p.atoms) for p in made.placement] == [(daemon.node_id, ("GPU-SN-RSV-0",))]
    active = await settle_reservation(gw, made.id, "active")
    assert [h.state for h in active.history] == ["placed", "bound", "active"]
    generation, allocations = await desired(gw, daemon.node_id)
    assert generation == 2
    assert [(a["id"], a["gpus"]) for a in allocations] == [(made.id, ["GPU-SN-RSV-0"])]
    assert (await node(gw, daemon.node_id)).observed_generation == 2  # the daemon applied and acknowledged it
    spec = json.loads((daemon.cdi / "bettercompute.io-gpu.json").read_text())
    assert {d["name"] for d in spec["devices"]} == {made.id, "GPU-SN-RSV-0"}  # what a container runtime is given
    # Two MIG slices on the other GPU, then cancelled: released, and the node's desired state follows.
    mig = await group.create(
        gw.fleet.alice,
        CreateReservationInput(
            tenant=gw.fleet.acme,
            pool_id=adopted.pool_id,
            gpus=2,
            duration="PT30M",
            constraints=Constraints(mig_profile="3g.40gb"),
        ),
    )
    await settle_reservation(gw, mig.id, "active")
    await group.cancel(gw.fleet.alice, CancelReservationInput(id=mig.id))
    # The end of the first: the clock moves past it and the controller ends it.
    gw.fleet.clock.set(made.end_at + dt.timedelta(seconds=1))
    ended = await settle_reservation(gw, made.id, "ended")
    assert ended.history[-1].reason == "end_reached"
    _, allocations = await desired(gw, daemon.node_id)
    assert allocations == []
    states = [p["state"] for _, p in await gw.fleet.events("reservation.bound")]
    assert states == ["bound", "bound"]
    assert [k for k, _ in await gw.fleet.events("reservation.ended")] == [made.id]
    assert [k for k, _ in await gw.fleet.events("reservation.cancelled")] == [mig.id]
