"""``VmHost`` and the agent: a desired ``instances`` section is carried out in the background and acknowledged only
once every instance was acted on; instances no longer listed are destroyed; states are reported on each change, a
console change at most every interval, and a failed report is sent again without stopping anything."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import bettercompute_proto as wire
from bettercompute_daemon._agent import Agent, _Session
from bettercompute_daemon._inventory import Inventory
from bettercompute_daemon._state import NodeConfig
from bettercompute_daemon._vm import InstanceSpec, InstanceState, InstanceStatus, VmHost, parse_instances
from tests._timing import deadline

from ._signer import TestSigner
from .test_renewal import NODE_ID, joined

pytestmark = pytest.mark.anyio

IMAGE = {"id": "img", "url": "https://images.example/d.raw", "sha256": "a" * 64, "size": 1, "format": "raw"}


def entry(ident: str, *, power: str = "running", spec: int = 1) -> dict[str, Any]:
    return {
        "id": ident,
        "spec": spec,
        "power": power,
        "vcpu": 1,
        "memory_mib": 128,
        "disk_gib": 1,
        "hostname": "h",
        "ports": [22],
        "image": IMAGE,
    }


class FakeRuntime:
    """A runtime whose VMs are entries in a dict; ``apply`` takes ``delay`` seconds (an image download)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.vms: dict[str, InstanceStatus] = {}
        self.console: dict[str, str] = {}
        self.calls: list[tuple[str, str]] = []

    def known(self) -> list[str]:
        return sorted(self.vms)

    async def apply(self, spec: InstanceSpec) -> InstanceStatus:
        self.calls.append(("apply", spec.id))
        self.vms[spec.id] = InstanceStatus(id=spec.id, spec=spec.spec, state="provisioning")
        await asyncio.sleep(self.delay)
        state: InstanceState = "running" if spec.power == "running" else "stopped"
        self.vms[spec.id] = status = InstanceStatus(id=spec.id, spec=spec.spec, state=state, addresses=("10.0.0.2",))
        return status

    async def stop(self, instance_id: str) -> InstanceStatus:
        raise NotImplementedError

    async def destroy(self, instance_id: str) -> None:
        self.calls.append(("destroy", instance_id))
        self.vms.pop(instance_id, None)

    def status(self, instance_id: str) -> InstanceStatus | None:
        return self.vms.get(instance_id)

    def poll(self) -> list[str]:
        return []

    def console_tail(self, instance_id: str, max_bytes: int = 16384) -> str:
        return self.console.get(instance_id, "")[-max_bytes:]

    def address_of(self, instance_id: str) -> str | None:
        return None

    def endpoint(self, instance_id: str, port: int) -> tuple[str, int] | None:
        return None


async def _until(check: Any, within: float = 5.0) -> None:
    ends = time.monotonic() + deadline(within)
    while not check():
        assert time.monotonic() < ends, "timed out"
        await asyncio.sleep(0.02)


async def test_instances_no_longer_listed_are_destroyed_and_malformed_ones_reported() -> None:
    runtime = FakeRuntime()
    host = VmHost(runtime)
    await host.apply(*parse_instances({"instances": [entry("a"), entry("b")]}))
    assert runtime.known() == ["a", "b"]
    specs, invalid = parse_instances({"instances": [entry("b", power="stopped"), {**entry("c"), "power": "?"}]})
    await host.apply(specs, invalid)
    assert runtime.known() == ["b"] and ("destroy", "a") in runtime.calls
    report = {i["id"]: i for i in host.snapshot()["instances"]}
    assert report["b"]["state"] == "stopped"
    assert (report["c"]["state"], report["c"]["reason"]) == ("failed", "INVALID_SPEC")


async def test_reports_follow_changes_and_a_failed_report_is_sent_again() -> None:
    runtime = FakeRuntime()
    sent: list[dict[str, Any]] = []
    failures = [1]

    async def report(payload: Mapping[str, Any]) -> None:
        if failures:
            failures.pop()
            raise ConnectionError("gateway away")
        sent.append(json.loads(json.dumps(payload)))

    host = VmHost(runtime, report=report, console_interval=0.3, poll_interval=0.05)
    running = asyncio.create_task(host.run())
    try:
        await host.apply(*parse_instances({"instances": [entry("a")]}))
        await _until(lambda: sent and sent[-1]["instances"][0]["state"] == "running", within=5)
        count = len(sent)
        for line in range(5):  # the console changes fast: reports come at most every 0.3 s
            runtime.console["a"] = runtime.console.get("a", "") + f"line {line}\n"
            await asyncio.sleep(0.05)
        await _until(lambda: sent[-1]["instances"][0]["console"].endswith("line 4\n"))
        assert len(sent) - count <= 2
        entry_sent = sent[-1]["instances"][0]
        assert set(entry_sent) == {"id", "spec", "state", "reason", "message", "addresses", "console"}
        assert entry_sent["addresses"] == ["10.0.0.2"]
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


class FakeStream:
    """A session stream: frames to receive are put in ``inbox``; sent ones are kept in ``sent``."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[wire.ControlFrame | None] = asyncio.Queue()
        self.sent: list[wire.NodeFrame] = []

    async def recv_message(self) -> wire.ControlFrame | None:
        return await self.inbox.get()

    async def send_message(self, frame: wire.NodeFrame) -> None:
        self.sent.append(frame)

    def acks(self) -> list[int]:
        return [f.desired_state_ack.observed_generation for f in self.sent if f.desired_state_ack is not None]


async def test_the_agent_acknowledges_once_the_instances_were_acted_on(tmp_path: Path) -> None:
    now = time.time()
    state, key = joined(tmp_path, not_before=now - 60, not_after=now + 3600)
    state.save_config(NodeConfig(gateway="127.0.0.1:1", trust_domain="example.com", pool=None, join_key="k" * 43))
    signer = TestSigner("example.com")
    signer.pin(state)
    runtime = FakeRuntime(delay=0.5)
    host = VmHost(runtime)
    agent = Agent(state, Inventory(claims={}, sections={}, health={}, fake=True), cdi_dir=None, vms=host)
    assert "vm" in agent._capabilities
    stream = FakeStream()
    session = _Session(stream=stream, channel=None, key=key)  # type: ignore[arg-type]  # never dialed
    serving = asyncio.create_task(agent._serve(session))

    def desired(generation: int, *instances: dict[str, Any]) -> wire.ControlFrame:
        content = json.dumps({"allocations": [], "instances": list(instances)})
        return wire.ControlFrame(desired_state=signer.desired(NODE_ID, generation, content))

    try:
        await stream.inbox.put(desired(1, entry("a")))
        await asyncio.sleep(0.2)
        assert stream.acks() == []  # the image is still "downloading"; the session goes on meanwhile
        await _until(lambda: stream.acks() == [1])
        assert runtime.vms["a"].state == "running"
        await stream.inbox.put(desired(2, entry("a", spec=2)))
        await stream.inbox.put(desired(3))  # overtakes 2 before it was acted on: only 3 is acknowledged
        await _until(lambda: stream.acks() == [1, 3])
        assert runtime.known() == []
    finally:
        await stream.inbox.put(None)
        await serving


class EndpointRuntime(FakeRuntime):
    """Every instance at 10.0.0.<n> on the node's bridge."""

    def endpoint(self, instance_id: str, port: int) -> tuple[str, int] | None:
        return ("10.0.0.2", port) if instance_id in self.vms else None


async def test_a_tunnel_reaches_only_a_port_an_instance_this_node_runs_exposes(tmp_path: Path) -> None:
    runtime = EndpointRuntime()
    host = VmHost(runtime)
    await host.apply(*parse_instances({"instances": [entry("a")]}))  # exposes port 22 only
    now = time.time()
    state, _ = joined(tmp_path, not_before=now - 60, not_after=now + 3600)
    state.save_config(NodeConfig(gateway="127.0.0.1:1", trust_domain="example.com", pool=None, join_key="k" * 43))
    inventory = Inventory(claims={}, sections={}, health={}, fake=True)
    agent = Agent(state, inventory, cdi_dir=None, vms=host, tunnel_local_ports=(9100,))
    assert agent._tunnel_target("instance:a", 22) == ("10.0.0.2", 22)
    assert agent._tunnel_target("instance:a", 80) is None  # not one of its ports
    assert agent._tunnel_target("instance:b", 22) is None  # not an instance of this node
    assert agent._tunnel_target("instance:", 22) is None
    assert agent._tunnel_target("10.0.0.2", 22) is None  # an address is no instance target
    assert agent._tunnel_target("127.0.0.1", 9100) == ("127.0.0.1", 9100)
    assert agent._tunnel_target("127.0.0.1", 22) is None
    assert agent._tunnel_target("instance:a", 0) is None
    await host.apply(*parse_instances({"instances": []}))
    assert agent._tunnel_target("instance:a", 22) is None  # deleted: gone at once
    without_vms = Agent(state, inventory, cdi_dir=None)
    assert without_vms._tunnel_target("instance:a", 22) is None
