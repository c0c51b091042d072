"""The ``bcd`` command: ``bcd join ...`` (exactly what ``join-tokens.create`` prints) and ``bcd node``."""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ._agent import DaemonError, join, run_node
from ._inventory import Inventory
from ._renewal import REENROLL_TOKEN
from ._state import DEFAULT_STATE_DIR, NodeConfig, StateDir

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bcd", description="The Better Compute node daemon (it only dials out).")
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
    joining = commands.add_parser("join", help="join a pool with a one-time token")
    joining.add_argument("--token", required=True, help="the join token (bcjt_<id>.<secret>)")
    joining.add_argument("--gateway", required=True, help="the gateway to dial, host:port")
    joining.add_argument("--trust-domain", required=True, help="the control plane's trust domain")
    joining.add_argument("--ca-bundle", required=True, help="the CA bundle to trust, base64 of its PEM")
    joining.add_argument("--join-key", required=True, help="JoinService's public key the token is sealed to")
    joining.add_argument("--pool", default=None, help="the pool this machine is meant for")
    joining.add_argument(
        "--keep-token",
        action="store_true",
        help="keep the token (reenroll.token, 0600) to join again with should the certificate expire while the"
        " machine is off; use a token with several uses whose reclaim is same-hardware",
    )
    commands.add_parser("node", help="hold the node's session with the gateway")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``bcd``; the exit status (``3``: the node's identity was revoked or retired, ``4``: its certificate
    expired and it could not join again; do not restart on either)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="bcd: %(message)s", stream=sys.stderr)
    state = StateDir(args.state_dir)
    try:
        inventory = Inventory.load(args.fake_inventory)
        if args.command == "join":
            try:
                bundle = base64.b64decode(args.ca_bundle, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise DaemonError("--ca-bundle must be base64 of a PEM bundle") from None
            config = NodeConfig(
                gateway=args.gateway, trust_domain=args.trust_domain, pool=args.pool, join_key=args.join_key
            )
            identity = asyncio.run(
                join(state=state, token=args.token, config=config, bundle_pem=bundle, inventory=inventory)
            )
            if args.keep_token:
                state.write(REENROLL_TOKEN, args.token.encode())
            print(f"joined as {identity.node_id}; run `bcd node` to hold its session")
            return 0
        return asyncio.run(run_node(state, inventory))
    except DaemonError as exc:
        print(f"bcd: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"bcd: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
