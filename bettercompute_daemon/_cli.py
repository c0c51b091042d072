"""The ``bcd`` command: ``bcd join ...`` (exactly what ``join-tokens.create`` prints, or ``--config`` with a pinned
configuration file), ``bcd node``, and ``bcd unit`` (the systemd unit for this ``bcd``, as the install script
writes it)."""

from __future__ import annotations

import argparse
import asyncio
import importlib.resources
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from ._agent import VERSION, DaemonError, join, run_node
from ._cdi import DEFAULT_CDI_DIR
from ._config import FIELDS, read_config_file, resolve
from ._inventory import Inventory
from ._pin import fetch_pinned_bundle
from ._renewal import REENROLL_TOKEN
from ._state import DEFAULT_STATE_DIR, StateDir

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
    joining.add_argument("--config", type=Path, default=None, help="the pinned configuration file (JSON)")
    joining.add_argument("--gateway", help="the gateway to dial, host:port")
    joining.add_argument("--trust-domain", help="the control plane's trust domain")
    joining.add_argument("--ca-bundle", help="the CA bundle to trust, base64 of its PEM")
    joining.add_argument(
        "--ca-pin",
        help="instead of --ca-bundle: sha256:<hex> of the CA certificates (DER, sorted, concatenated); the bundle is "
        "fetched from the gateway and trusted only if it matches",
    )
    joining.add_argument("--join-key", help="JoinService's public key the token is sealed to")
    joining.add_argument("--pool", default=None, help="the pool this machine is meant for")
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
    commands.add_parser("unit", help="print the systemd unit that runs this bcd's `bcd node`")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``bcd``; the exit status (``3``: the node's identity was revoked or retired, ``4``: its certificate
    expired and it could not join again; do not restart on either)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="bcd: %(message)s", stream=sys.stderr)
    state = StateDir(args.state_dir)
    try:
        if args.command == "unit":
            print(unit(args.state_dir, args.fake_inventory), end="")
            return 0
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
        inventory = Inventory.load(args.fake_inventory)
        if inventory.xids is not None:
            inventory.xids.start()  # a thread of its own, for the life of the process
        return asyncio.run(run_node(state, inventory, cdi_dir=args.cdi_dir))
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
