"""The ``bcd`` command: ``bcd join ...`` (exactly what ``join-tokens.create`` prints, or ``--config`` with a pinned
configuration file), ``bcd node``, ``bcd unit`` (the systemd unit for this ``bcd``, as the install script writes
it), ``bcd sim`` (a simulated fleet, ``_sim``), ``bcd ramdisk`` (the agent of a bare-metal machine's network-booted
ramdisk, ``_ramdisk``) and ``bcd site`` (a site's boot server: ``join``, ``run``, ``serve-local``; ``_site_cli``)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.resources
import logging
import os
import re
import shlex
import sys
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from ._agent import VERSION, join, run_node
from ._cdi import DEFAULT_CDI_DIR
from ._config import DEFAULT_NODE_CONFIG, FIELDS, NodeSettings, node_settings, read_config_file, resolve
from ._errors import ConfigError, DaemonError
from ._inventory import Inventory, vm_section
from ._pin import fetch_pinned_bundle
from ._ramdisk import CMDLINE, DEFAULT_REBOOT_COMMAND, build_machine, parse_cmdline, resolve_settings, run_ramdisk
from ._renewal import REENROLL_TOKEN
from ._sim import SimOptions, Simulator, run_sim
from ._site_cli import add_site_parser, site_main
from ._state import DEFAULT_STATE_DIR, NodeConfig, StateDir
from ._vm import QemuOptions, QemuRuntime, VmHost

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bcd", description="The Better Compute node daemon (it only dials out).")
    parser.add_argument("--version", action="version", version=f"bcd {VERSION}")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(os.environ.get("BCD_STATE_DIR", DEFAULT_STATE_DIR)),
        help=f"where the key, certificate and pinned configuration are kept (default {DEFAULT_STATE_DIR})",
    )
    parser.add_argument(
        "--fake-inventory",
        type=Path,
        default=os.environ.get("BCD_FAKE_INVENTORY") or None,
        help="declare this machine's hardware from a JSON file (a machine without GPUs); reported as fake",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    joining = commands.add_parser(
        "join",
        help="join a pool with a one-time token",
        description="Join a pool. Everything but the token may come from a pinned configuration file (--config); a "
        "flag that repeats the file must agree with it.",
    )
    joining.add_argument("--token", required=True, help="the join token (bcjt_<id>.<secret>)")
    _join_options(joining)
    joining.add_argument(
        "--keep-token",
        action="store_true",
        help="keep the token (reenroll.token, 0600) to join again with should the certificate expire while the"
        " machine is off; use a token with several uses whose reclaim is same-hardware",
    )
    node = commands.add_parser("node", help="hold the node's session with the gateway")
    node.add_argument(
        "--cdi-dir",
        type=Path,
        default=Path(os.environ.get("BCD_CDI_DIR", DEFAULT_CDI_DIR)),
        help=f"where the CDI spec of the allocated GPUs is written (default {DEFAULT_CDI_DIR})",
    )
    node.add_argument(
        "--config",
        dest="node_config",
        type=Path,
        default=os.environ.get("BCD_NODE_CONFIG") or None,
        help=f"the node's settings, a JSON file (VM instances: vm_dir, image_dirs, vm_subnet, vm_network, vm_accel; "
        f"tunnels: tunnel_local_ports; default {DEFAULT_NODE_CONFIG} when it exists; docs/vps-node.md)",
    )
    node.add_argument(
        "--tunnel-local-port",
        dest="tunnel_local_ports",
        type=_count(1, 65535),
        action="append",
        default=[],
        help="a port of a service on 127.0.0.1 that tunnels may reach, besides the settings' tunnel_local_ports"
        " (repeat for more; none by default)",
    )
    commands.add_parser("unit", help="print the systemd unit that runs this bcd's `bcd node`")
    _sim_parser(commands.add_parser)
    _ramdisk_parser(commands.add_parser)
    add_site_parser(commands.add_parser)
    return parser


def _ramdisk_parser(add: Any) -> None:
    ramdisk = add(
        "ramdisk",
        help="the agent of a bare-metal machine's network-booted ramdisk",
        description="Join with the ramdisk token, then run the control plane's tasks (diagnose, wipe, deploy) until "
        "it needs nothing more; after a deploy, reboot. The token, gateway and CA pin come from the flags, else from "
        "the kernel command line (bc.token=, bc.gateway=, bc.ca_pin=). Nothing is written but the disks and the "
        "cloud-init seed.",
    )
    ramdisk.add_argument("--token", help="the ramdisk token (bcrt_<id>.<secret>)")
    ramdisk.add_argument("--gateway", help="the gateway to dial, host:port")
    ramdisk.add_argument("--ca-pin", help="sha256:<hex> of the CA certificates the gateway's bundle must match")
    ramdisk.add_argument("--ca-bundle", help="instead of a pin: the CA bundle to trust, base64 of its PEM")
    ramdisk.add_argument("--machine", help="the machine the token is for (default: bc.machine= of the command line)")
    ramdisk.add_argument(
        "--cmdline-file",
        type=Path,
        default=None,
        help=f"the kernel command line to read bc.* parameters from (default {CMDLINE}, when readable)",
    )
    ramdisk.add_argument(
        "--disk",
        dest="disks",
        action="append",
        default=[],
        metavar="PATH",
        help="a disk this ramdisk reports and may wipe or write: a block device or a regular file (repeatable; "
        "default: the whole disks of /sys/block)",
    )
    ramdisk.add_argument(
        "--cloud-init-dir",
        type=Path,
        default=None,
        help="where a deploy writes the cloud-init NoCloud seed (user-data, meta-data); default: a cidata folder "
        "beside a disk that is a file, /run/bcd-ramdisk/cidata for a block device",
    )
    ramdisk.add_argument(
        "--reboot-command",
        default=DEFAULT_REBOOT_COMMAND,
        help=f"run once a deploy succeeded and nothing more is asked (default: {DEFAULT_REBOOT_COMMAND})",
    )
    ramdisk.add_argument(
        "--fake-inventory",
        dest="ramdisk_fake_inventory",
        type=Path,
        default=None,
        help="declare the machine's hardware from a JSON file, as for bcd join",
    )


def _join_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help="the pinned configuration file (JSON)")
    parser.add_argument("--gateway", help="the gateway to dial, host:port")
    parser.add_argument("--trust-domain", help="the control plane's trust domain")
    parser.add_argument("--ca-bundle", help="the CA bundle to trust, base64 of its PEM")
    parser.add_argument(
        "--ca-pin",
        help="instead of --ca-bundle: sha256:<hex> of the CA certificates (DER, sorted, concatenated); the bundle is "
        "fetched from the gateway and trusted only if it matches",
    )
    parser.add_argument("--join-key", help="JoinService's public key the token is sealed to")
    parser.add_argument("--pool", default=None, help="the pool this machine is meant for")


def _count(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}, not {value}")
        return value

    return parse


def _number(low: float, high: float | None = None) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value >= low and (high is None or value <= high)):  # NaN fails both
            bound = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, not {text}")
        return value

    return parse


def _sim_parser(add: Any) -> None:
    sim = add(
        "sim",
        help="run a deterministic simulated fleet over the real wire",
        description="Run N simulated nodes in this one process: each joins with the (multi-use) token, holds its own "
        "mutual-TLS session, answers inventory and commands and acknowledges desired state. Nodes already joined in "
        "--state-dir are reused. Prints a JSON summary on SIGINT or SIGTERM.",
    )
    sim.add_argument("--nodes", type=_count(1, 100_000), required=True, help="how many nodes")
    sim.add_argument("--seed", type=_count(0, 2**63), default=0, help="what the fleet and its faults are drawn from")
    sim.add_argument(
        "--state-dir", dest="sim_state_dir", type=Path, required=True, help="each node's state, in <index>/"
    )
    sim.add_argument("--token", default=None, help="a join token with enough uses (needed while a node has not joined)")
    _join_options(sim)
    sim.add_argument("--gpus-per-node", type=_count(1, 64), default=8, help="GPUs of each node (default 8)")
    sim.add_argument("--unhealthy", type=_number(0, 1), default=0.0, help="share of GPUs declared unhealthy")
    sim.add_argument(
        "--fail-acceptance", type=_number(0, 1), default=0.0, help="share of nodes whose diag.nvml finds an ECC error"
    )
    sim.add_argument(
        "--drop-sessions", type=_number(0), default=0.0, help="sessions dropped per node per minute (then reconnected)"
    )
    sim.add_argument("--ack-delay", type=_number(0), default=0.0, help="seconds before a desired state is acked")
    sim.add_argument("--join-concurrency", type=_count(1, 1024), default=8, help="joins under way at once (default 8)")
    sim.add_argument(
        "--open-concurrency", type=_count(1, 10_000), default=64, help="first sessions being opened at once"
    )
    sim.add_argument("--duration", type=_number(0), default=None, help="stop after this many seconds")
    sim.add_argument("--debug", action="store_true", help="print one JSON line per notable event on stdout")


def _sim(args: argparse.Namespace) -> int:
    options = SimOptions(
        nodes=args.nodes,
        seed=args.seed,
        gpus_per_node=args.gpus_per_node,
        unhealthy=args.unhealthy,
        fail_acceptance=args.fail_acceptance,
        drop_sessions=args.drop_sessions,
        ack_delay=args.ack_delay,
        join_concurrency=args.join_concurrency,
        open_concurrency=args.open_concurrency,
    )
    logging.getLogger("bcd").setLevel(logging.INFO if args.debug else logging.WARNING)
    probe = Simulator(args.sim_state_dir, options)
    unjoined = probe.unjoined()
    config: NodeConfig | None = None
    bundle: str | None = None
    pin: str | None = None
    if unjoined:
        problems = [] if args.token else [f"--token: {len(unjoined)} of the {options.nodes} nodes have not joined yet"]
        flags = {name: getattr(args, name) for name in FIELDS}
        joined = [i for i in range(options.nodes) if i not in set(unjoined)]
        if joined and args.config is None and not any(flags.values()):
            # More nodes than last time: they join where the others did, trusting what they were pinned to.
            state = probe.state(joined[0])
            config, bundle = state.config(), state.read("pinned-ca.pem").decode()
        else:
            try:
                file = read_config_file(args.config) if args.config is not None else None
                resolved = resolve(flags, file, path=str(args.config or ""))
                config, bundle, pin = resolved.node_config(), resolved.ca_bundle_pem, resolved.ca_pin
            except ConfigError as exc:
                problems += exc.problems
        if problems:
            raise ConfigError(problems)
    print(
        f"bcd sim: {options.nodes} nodes from seed {options.seed} in {args.sim_state_dir} ({len(unjoined)} to join)",
        file=sys.stderr,
    )

    async def main() -> int:
        trusted = bundle
        if config is not None and trusted is None:
            trusted = await fetch_pinned_bundle(config.gateway, pin or "")
        simulator = Simulator(
            args.sim_state_dir,
            options,
            token=args.token,
            config=config,
            bundle_pem=trusted,
            events=sys.stdout if args.debug else None,
        )
        return await run_sim(simulator, duration=args.duration)

    return _run(main())


def _ramdisk(args: argparse.Namespace) -> int:
    path = args.cmdline_file
    if path is None:
        cmdline = CMDLINE.read_text(errors="replace") if CMDLINE.exists() else ""
    else:
        cmdline = path.read_text(errors="replace")
    flags = {name: getattr(args, name) for name in ("token", "gateway", "ca_pin", "ca_bundle", "machine")}
    settings = resolve_settings(flags, parse_cmdline(cmdline))
    reboot = shlex.split(args.reboot_command)
    if not reboot:
        raise ConfigError(["--reboot-command: empty"])
    inventory = Inventory.load(args.ramdisk_fake_inventory or args.fake_inventory)
    machine = build_machine(inventory, disks=args.disks, cloud_init_dir=args.cloud_init_dir)
    return asyncio.run(run_ramdisk(settings, machine, reboot_command=reboot))


def _node_settings(path: Path | None) -> NodeSettings:
    """The node's settings: the given file, else the default one when it exists, else none (no VMs).

    Raises:
        ConfigError: the file cannot be read or has problems.
    """
    if path is None:
        if not DEFAULT_NODE_CONFIG.exists():
            return NodeSettings()
        path = DEFAULT_NODE_CONFIG
    try:
        values = read_config_file(path)
    except ConfigError as exc:
        raise ConfigError(exc.problems, subject="the node settings file") from None
    return node_settings(values, path=str(path))


def _vm_host(state: StateDir, settings: NodeSettings) -> VmHost | None:
    """The VM host of a node whose settings name a ``vm_dir`` (made inside the event loop: it owns asyncio events)."""
    if settings.vm_dir is None:
        return None
    identity = state.identity()
    if identity is None:
        raise DaemonError(f"no node identity in {state.path}: run bcd join first")
    if settings.vm_network == "bridge" and os.geteuid() != 0:
        raise ConfigError(['vm_network: "bridge" needs root (CAP_NET_ADMIN); run as root or use "user"'])
    options = QemuOptions.for_node(
        identity.node_id,
        settings.vm_dir,
        cache_dir=settings.vm_cache_dir,
        image_dirs=settings.image_dirs,
        subnet=settings.vm_subnet,
        network=settings.vm_network,
        accel=settings.vm_accel,
        stop_timeout=settings.vm_stop_timeout,
    )
    return VmHost(QemuRuntime(options))


def _run(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop when it is installed (as the gateway does), else on asyncio's own loop."""
    try:
        import uvloop  # an optional dependency, imported only here
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``bcd``; the exit status (``3``: the node's identity was revoked or retired, ``4``: its certificate
    expired and it could not join again; do not restart on either)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="bcd: %(message)s", stream=sys.stderr)
    state = StateDir(args.state_dir)
    try:
        if args.command == "sim":
            return _sim(args)
        if args.command == "unit":
            print(unit(args.state_dir, args.fake_inventory), end="")
            return 0
        if args.command == "ramdisk":
            return _ramdisk(args)
        if args.command == "site":
            return site_main(args)
        if args.command == "join":
            flags = {name: getattr(args, name) for name in FIELDS}
            file = read_config_file(args.config) if args.config is not None else None
            config = resolve(flags, file, path=str(args.config or ""))
            inventory = Inventory.load(args.fake_inventory)
            # resolve() gives a bundle or a pin; with a pin, nothing is written unless the gateway's bundle matches
            bundle = config.ca_bundle_pem or asyncio.run(fetch_pinned_bundle(config.gateway, config.ca_pin or ""))
            identity = asyncio.run(
                join(
                    state=state,
                    token=args.token,
                    config=config.node_config(),
                    bundle_pem=bundle,
                    inventory=inventory,
                )
            )
            if args.keep_token:
                state.write(REENROLL_TOKEN, args.token.encode())
            print(f"joined as {identity.node_id}; run `bcd node` to hold its session")
            return 0
        settings = _node_settings(args.node_config)
        inventory = Inventory.load(args.fake_inventory)
        if settings.vm_dir is not None and "vm" not in inventory.sections:
            # What the node offers to instances (a fake inventory may declare its own ``vm`` section).
            gpus = inventory.sections.get("gpus")
            inventory.sections["vm"] = vm_section(
                settings.vm_dir,
                vcpu=settings.vm_vcpu,
                memory_mib=settings.vm_memory_mib,
                disk_gib=settings.vm_disk_gib,
                gpus=[str(g["uuid"]) for g in gpus if isinstance(g, dict) and g.get("uuid")]
                if isinstance(gpus, list)
                else [],
            )
        if inventory.xids is not None:
            inventory.xids.start()  # a thread of its own, for the life of the process

        async def node() -> int:
            return await run_node(
                state,
                inventory,
                cdi_dir=args.cdi_dir,
                vms=_vm_host(state, settings),
                tunnel_local_ports={*settings.tunnel_local_ports, *args.tunnel_local_ports},
            )

        return asyncio.run(node())
    except ConfigError as exc:
        print(f"bcd: {exc}", file=sys.stderr)
        return 2 if args.command == "sim" else 1
    except DaemonError as exc:
        print(f"bcd: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"bcd: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


_UNIT_PATH = re.compile(r"/[A-Za-z0-9/._+-]*")


def unit(state_dir: Path, fake_inventory: Path | None = None) -> str:
    """The packaged systemd unit (``systemd/bcd.service``), its ``ExecStart`` naming this ``bcd`` and ``state_dir``
    (and the fake inventory, on a machine that declares one).

    Raises:
        DaemonError: a path holds a character a unit file would need escaped (a space, ``%``, a quote, ...).
    """
    paths = [os.path.abspath(sys.argv[0]), os.path.abspath(state_dir)]
    if fake_inventory is not None:
        paths.append(os.path.abspath(fake_inventory))
    for path in paths:
        if not _UNIT_PATH.fullmatch(path):
            raise DaemonError("a path in the unit may hold only A-Z, a-z, 0-9, '/', '.', '_', '+' and '-'")
    command = f"{paths[0]} --state-dir {paths[1]}"
    if fake_inventory is not None:
        command += f" --fake-inventory {paths[2]}"
    packaged = importlib.resources.files("bettercompute_daemon").joinpath("systemd/bcd.service").read_text()
    lines = [f"ExecStart={command} node" if line.startswith("ExecStart=") else line for line in packaged.splitlines()]
    return "\n".join(lines) + "\n"
