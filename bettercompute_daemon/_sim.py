"""``bcd sim``: a fleet of simulated nodes in one process, over the real wire.

Each node is what ``bcd join`` and ``bcd node`` make of a machine: its own key and certificate (kept in
``DIR/<index>/`` as a state directory, so a second run with the same ``DIR`` joins nothing again), its own mutual-TLS
session held by the daemon's own ``Agent``, inventory answered, ``diag.nvml`` answered with the declared health and
signed with the node key, desired states acknowledged, the certificate renewed. What a simulated node does not do is
touch the machine: no CDI file, no NVML.

Everything a node declares follows from ``--seed`` and its index (``node_inventory``): hostname, serials, GPU UUIDs,
the GPU model (H100 80GB, A100 80GB, L40S), the driver, MIG on some nodes (with its MIG devices), NVLink peers on
the SXM machines; and the faults (``plan_faults``): which GPUs are unhealthy (an uncorrectable ECC error, or XID
79), which nodes fail acceptance (their ``diag.nvml`` reports an uncorrectable ECC error their inventory did not
show), when each node's sessions are dropped. The ``gpus`` section and the health have the shapes ``_nvml`` gives a
real machine (the health is computed by the same function), so the control plane judges both alike. Each node's
declaration is written to ``DIR/<index>/inventory.json`` in the fake-inventory format, so ``bcd --state-dir
DIR/<index> --fake-inventory DIR/<index>/inventory.json node`` runs that one node as the real daemon.

Scale: one event loop (uvloop when installed) and a few tasks per node, no thread; joins go through a semaphore
(``--join-concurrency``), and so does the opening of first sessions, so that thousands of nodes do not hit the
gateway in the same second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import resource
import signal
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import attrs

from ._agent import Agent, join
from ._errors import DaemonError, JoinRefused
from ._inventory import Inventory
from ._nvml import health_of
from ._state import NodeConfig, StateDir

__all__ = ["SimOptions", "SimStats", "Simulator", "node_inventory", "plan_faults"]

log = logging.getLogger("bcd.sim")

INVENTORY_FILE = "inventory.json"
JOIN_RETRY_FIRST = 1.0
JOIN_RETRY_LAST = 30.0


@attrs.frozen(kw_only=True)
class _Model:
    name: str
    memory_mib: int
    product: str
    vendor: str
    nvlink: bool
    mig_slice_mib: int | None
    """The memory of a 1g.10gb MIG device; ``None``: the card has no MIG."""
    weight: float


MODELS = (
    _Model(
        name="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        product="DGX H100",
        vendor="NVIDIA",
        nvlink=True,
        mig_slice_mib=9856,
        weight=0.45,
    ),
    _Model(
        name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        product="DGX A100",
        vendor="NVIDIA",
        nvlink=True,
        mig_slice_mib=9728,
        weight=0.35,
    ),
    _Model(
        name="NVIDIA L40S",
        memory_mib=46068,
        product="PowerEdge R760xa",
        vendor="Dell Inc.",
        nvlink=False,
        mig_slice_mib=None,
        weight=0.20,
    ),
)
DRIVERS = ("550.54.15", "550.90.07", "535.183.01")
MIG_SHARE = 0.25
"""The share of the nodes with MIG-capable GPUs that run with MIG on (every GPU of such a node)."""
MIG_SLICES = 7
FAULT_EPOCH_MS = 1_767_225_600_000
"""When the declared XIDs were "heard" (2026-01-01, plus a drawn offset): fixed, so the same seed says the same."""


@attrs.frozen(kw_only=True)
class SimOptions:
    """What ``bcd sim`` simulates."""

    nodes: int
    seed: int = 0
    gpus_per_node: int = 8
    unhealthy: float = 0.0
    """The share of all GPUs declared unhealthy (an uncorrectable ECC error, or XID 79)."""
    fail_acceptance: float = 0.0
    """The share of nodes whose ``diag.nvml`` reports an uncorrectable ECC error."""
    drop_sessions: float = 0.0
    """Sessions dropped per node per minute (then reconnected)."""
    ack_delay: float = 0.0
    join_concurrency: int = 8
    open_concurrency: int = 64


@attrs.frozen(kw_only=True)
class Faults:
    """Which GPUs (node index, GPU index) are declared unhealthy, and which nodes fail acceptance."""

    unhealthy: frozenset[tuple[int, int]]
    failing: frozenset[int]


def _rng(seed: int, *what: object) -> random.Random:
    """A generator of its own for one part of the fleet (string seeds are hashed, the same in every process)."""
    return random.Random(":".join(map(str, ("bcd-sim", seed, *what))))  # noqa: S311 - simulation, not secrets


def plan_faults(options: SimOptions) -> Faults:
    """The faults of the fleet: exactly the rounded share of GPUs and nodes, drawn from the seed."""
    rng = _rng(options.seed, "faults")
    total = options.nodes * options.gpus_per_node
    picked = rng.sample(range(total), round(total * options.unhealthy))
    failing = rng.sample(range(options.nodes), round(options.nodes * options.fail_acceptance))
    return Faults(
        unhealthy=frozenset(divmod(n, options.gpus_per_node) for n in picked),
        failing=frozenset(failing),
    )


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _gpus(
    rng: random.Random, model: _Model, driver: str, uuids: list[str], *, mig_on: bool, node: int, faults: Faults
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Node ``node``'s GPUs as its inventory shows them, and the XID errors of its unhealthy GPUs that have one (the
    rest have uncorrectable ECC errors); the random draws in the order the fleet's seed expects."""
    gpus: list[dict[str, Any]] = []
    xids: list[dict[str, Any]] = []
    for gpu_index, gpu_uuid in enumerate(uuids):
        mig: dict[str, Any] | None = None
        if model.mig_slice_mib is not None:
            mig = {"current": mig_on, "pending": mig_on}
            if mig_on:
                mig["devices"] = [
                    {"uuid": f"MIG-{_uuid(rng)}", "profile": "1g.10gb", "memory_mib": model.mig_slice_mib}
                    for _ in range(MIG_SLICES)
                ]
        uncorrected = 0
        if (node, gpu_index) in faults.unhealthy:
            if rng.random() < 0.5:
                uncorrected = rng.randint(1, 4)
            else:
                xids.append({"uuid": gpu_uuid, "xid": 79, "at_ms": FAULT_EPOCH_MS + rng.randrange(86_400_000)})
        gpus.append(
            {
                "index": gpu_index,
                "uuid": gpu_uuid,
                "model": model.name,
                "memory_mib": model.memory_mib,
                "minor": gpu_index,
                "pci_bus_id": f"00000000:{(0x18 + 0x11 * gpu_index) % 0x100:02X}:00.0",
                "serial": str(1650000000000 + rng.randrange(10**10)),
                "driver_version": driver,
                "mig": mig,
                "nvlink_peers": [u for u in uuids if u != gpu_uuid] if model.nvlink else [],
                "ecc": {
                    "enabled": True,
                    "volatile": {"corrected": 0, "uncorrected": uncorrected},
                    "aggregate": {"corrected": rng.randrange(3), "uncorrected": uncorrected},
                },
                "retired_pages": None,  # Ampere and later remap rows instead
                "remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False},
                "recovery_action": "none",
            }
        )
    return gpus, xids


def node_inventory(options: SimOptions, index: int, faults: Faults) -> dict[str, Any]:
    """What node ``index`` of the fleet declares, in the fake-inventory format (``claims``, ``sections``,
    ``health``); the same for the same seed and options."""
    rng = _rng(options.seed, "node", index)
    model = rng.choices(MODELS, weights=[m.weight for m in MODELS])[0]
    driver = rng.choice(DRIVERS)
    mig_on = model.mig_slice_mib is not None and rng.random() < MIG_SHARE
    count = options.gpus_per_node
    uuids = [f"GPU-{_uuid(rng)}" for _ in range(count)]
    gpus, xids = _gpus(rng, model, driver, uuids, mig_on=mig_on, node=index, faults=faults)
    health_gpus = gpus
    if index in faults.failing:  # an error the inventory did not show yet: acceptance finds it
        first = gpus[0]
        volatile = {"corrected": 0, "uncorrected": max(1, first["ecc"]["volatile"]["uncorrected"])}
        health_gpus = [{**first, "ecc": {**first["ecc"], "volatile": volatile}}, *gpus[1:]]
    claims = {
        "hostname": f"sim{options.seed}-{index:05d}",
        "serial": f"SIM{rng.getrandbits(48):012X}",
        "system_uuid": _uuid(rng),
        "product": model.product,
        "vendor": model.vendor,
        "gpu_model": model.name,
        "gpu_count": count,
        "gpu_uuids": uuids,
    }
    sections = {
        "cpu": {"count": 224, "sockets": 2, "model": "Intel(R) Xeon(R) Platinum 8480+", "architecture": "x86_64"},
        "memory": {"bytes": 2 * 1024**4},
        "disks": [
            {
                "name": f"nvme{n}n1",
                "bytes": 3840755982336,
                "rotational": False,
                "removable": False,
                "model": "SAMSUNG MZQL23T8HCLS-00A07",
                "serial": f"S64H{rng.getrandbits(32):08X}",
            }
            for n in range(2)
        ],
        "nics": [
            {
                "name": f"ens{n + 1}np0",
                "mac": "02:" + ":".join(f"{rng.randrange(256):02x}" for _ in range(5)),
                "mtu": 9000,
                "speed_mbps": 400000,
                "state": "up",
            }
            for n in range(2)
        ],
        "gpus": gpus,
    }
    return {"claims": claims, "sections": sections, "health": health_of(health_gpus, driver, xids)}


@attrs.define
class SimStats:
    """What the fleet did in this run."""

    nodes: int
    joined: int = 0
    """Nodes that joined in this run."""
    reused: int = 0
    """Nodes whose identity was already in the state directory."""
    join_refused: int = 0
    sessions_open: int = 0
    sessions_opened: int = 0
    reconnects: int = 0
    """Sessions opened by a node that had held one before in this run."""
    drops: int = 0
    inventory_reports: int = 0
    desired_states: int = 0
    """Desired states received (each acknowledged ``ack_delay`` later, while the session lasts)."""
    commands: int = 0
    acks: int = 0
    stopped: int = 0
    """Nodes told their identity is gone (revoked, retired)."""
    failed: int = 0
    """Nodes whose own state could not be used (a corrupt key or certificate, a disk error)."""

    def summary(self) -> dict[str, Any]:
        return {"event": "summary", **attrs.asdict(self)}


class Simulator:
    """The fleet: ``run()`` joins the nodes that have no identity in ``directory`` yet and holds every node's
    sessions until cancelled.

    Args:
        directory: Where each node keeps its state (``<index>/``).
        options: What is simulated.
        token: The multi-use join token (needed only for nodes that have not joined).
        config: Where to join and what to trust (needed only for nodes that have not joined).
        bundle_pem: The CA bundle to trust at the join.
        events: Where one JSON line per notable event is written (``None``: nowhere).
    """

    def __init__(
        self,
        directory: Path,
        options: SimOptions,
        *,
        token: str | None = None,
        config: NodeConfig | None = None,
        bundle_pem: str | None = None,
        events: TextIO | None = None,
    ) -> None:
        self.directory = directory
        self.options = options
        self.stats = SimStats(nodes=options.nodes)
        self._token = token
        self._config = config
        self._bundle_pem = bundle_pem
        self._events = events
        self._faults = plan_faults(options)
        self._joining = asyncio.Semaphore(options.join_concurrency)
        self._opening = asyncio.Semaphore(options.open_concurrency)
        self._started = time.monotonic()

    def state(self, index: int) -> StateDir:
        return StateDir(self.directory / str(index), durable=False)

    def unjoined(self) -> list[int]:
        """The nodes with no identity in the state directory yet."""
        return [i for i in range(self.options.nodes) if self.state(i).identity() is None]

    def inventory(self, index: int) -> Inventory:
        declared = node_inventory(self.options, index, self._faults)
        return Inventory(claims=declared["claims"], sections=declared["sections"], health=declared["health"], fake=True)

    async def run(self) -> None:
        """Run every node until cancelled (or until every node has stopped: refused, or its identity gone)."""
        tasks = [asyncio.create_task(self._node(i), name=f"bcd-sim-{i}") for i in range(self.options.nodes)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _event(self, name: str, index: int, facts: Mapping[str, Any]) -> None:
        if self._events is None:
            return
        line = {"event": name, "node": index, "at": round(time.monotonic() - self._started, 3), **facts}
        self._events.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._events.flush()

    async def _node(self, index: int) -> None:
        """Run node ``index``; a node whose own state is unusable stops alone, the fleet goes on."""
        try:
            await self._hold(index)
        except (OSError, ValueError, DaemonError) as exc:
            self.stats.failed += 1
            log.error("node %d stopped: %s", index, exc if isinstance(exc, DaemonError) else type(exc).__name__)
            self._event("failed", index, {"error": type(exc).__name__})

    async def _hold(self, index: int) -> None:
        state = self.state(index)
        inventory = self.inventory(index)
        declared = {"claims": inventory.claims, "sections": inventory.sections, "health": inventory.health}
        text = json.dumps(declared, indent=1).encode()
        if not (state.path / INVENTORY_FILE).exists() or state.read(INVENTORY_FILE) != text:
            state.write(INVENTORY_FILE, text)
        identity = state.identity()
        if identity is None:
            joined = await self._join(index, state, inventory)
            if joined is None:
                return
            node_id = joined
        else:
            self.stats.reused += 1
            node_id = identity.node_id
        first = asyncio.Event()  # the first session opened, or the first attempt ended
        held = 0
        live = False

        def observe(event: str, facts: Mapping[str, Any]) -> None:
            nonlocal held, live
            stats = self.stats
            if event == "session_opened":
                stats.sessions_open += 1
                stats.sessions_opened += 1
                stats.reconnects += 1 if held else 0
                held += 1
                live = True
                first.set()
            elif event == "session_ended":
                if live:
                    stats.sessions_open -= 1
                    live = False
                first.set()
            elif event == "inventory":
                stats.inventory_reports += 1
            elif event == "desired_state":
                stats.desired_states += 1
            elif event == "command":
                stats.commands += 1
            elif event == "ack":
                stats.acks += 1
            self._event(event, index, {"node_id": node_id, **facts})

        agent = Agent(state, inventory, cdi_dir=None, observer=observe, ack_delay=self.options.ack_delay)
        running: asyncio.Task[int] | None = None
        dropping = asyncio.create_task(self._drop(index, agent)) if self.options.drop_sessions > 0 else None
        try:
            async with self._opening:  # first sessions are opened a bounded number at a time
                running = asyncio.create_task(agent.run(), name=f"bcd-sim-agent-{index}")
                opened = asyncio.create_task(first.wait())
                await asyncio.wait({running, opened}, return_when=asyncio.FIRST_COMPLETED)
                opened.cancel()
            status = await running
            self.stats.stopped += 1
            self._event("stopped", index, {"node_id": node_id, "status": status})
        finally:
            for task in (dropping, running):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task

    async def _join(self, index: int, state: StateDir, inventory: Inventory) -> str | None:
        """Join node ``index``; its node id, or ``None`` when the join was refused."""
        if self._token is None or self._config is None or self._bundle_pem is None:
            raise DaemonError("a node that has not joined needs a token and a join configuration")
        backoff = JOIN_RETRY_FIRST
        while True:
            try:
                async with self._joining:
                    identity = await join(
                        state=state,
                        token=self._token,
                        config=self._config,
                        bundle_pem=self._bundle_pem,
                        inventory=inventory,
                    )
            except JoinRefused as exc:
                self.stats.join_refused += 1
                log.error("node %d: %s", index, exc)
                self._event("join_refused", index, {"reason": str(exc)})
                return None
            except DaemonError as exc:
                delay = backoff * random.uniform(0.5, 1.5)  # noqa: S311 - jitter, not a secret
                # info, not warning: with the gateway away, thousands of nodes would each say so
                log.info("node %d: %s; trying again in %.1f s", index, exc, delay)
                await asyncio.sleep(delay)
                backoff = min(backoff * 2, JOIN_RETRY_LAST)
                continue
            self.stats.joined += 1
            self._event("joined", index, {"node_id": identity.node_id})
            return identity.node_id

    async def _drop(self, index: int, agent: Agent) -> None:
        """Drop the node's session at the times drawn for it (a Poisson process at ``drop_sessions`` a minute)."""
        rng = _rng(self.options.seed, "drops", index)
        while True:
            await asyncio.sleep(rng.expovariate(self.options.drop_sessions / 60))
            if agent.drop():
                self.stats.drops += 1
                self._event("dropped", index, {})


def raise_open_files(nodes: int) -> None:
    """One connection per node: raise the soft limit of open files toward the hard one as far as it is needed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = nodes + 256
    if soft >= needed:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < needed:
        log.warning("only %d files may be open (ulimit -Hn): not every node will hold a session", hard)


async def run_sim(simulator: Simulator, *, duration: float | None = None, out: TextIO = sys.stdout) -> int:
    """Run ``simulator`` until SIGINT or SIGTERM (or ``duration`` seconds), then print the summary (one JSON line on
    ``out``); the exit status (``1`` when no node is left running)."""
    raise_open_files(simulator.options.nodes)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, stopping.set)
    fleet = asyncio.create_task(simulator.run(), name="bcd-sim")
    stop = asyncio.create_task(stopping.wait())
    try:
        await asyncio.wait({fleet, stop}, timeout=duration, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(number)
        stop.cancel()
        finished = fleet.done()
        fleet.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fleet
    out.write(json.dumps(simulator.stats.summary(), separators=(",", ":")) + "\n")
    out.flush()
    return 1 if finished else 0
