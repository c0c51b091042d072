"""``python -m examples.custom_deployment setup|iam|api|worker|gateway``: the deployment's one entry point.

Every part takes the same shared settings (flags, or the environment variables named in ``--help``); the
credential a process presents to the central IAM comes from the environment only, so it never shows in ``ps``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from bettercompute.errors import ComputeError

from ._compose import Deployment
from ._parts import run_api, run_gateway, run_iam, run_worker, setup

__all__ = ["main"]

CREDENTIAL_ENV = "BETTERCOMPUTE_IAM_CREDENTIAL"
_SHARED = (
    # flag, environment variable, what it is
    ("--database-url", "BETTERCOMPUTE_DATABASE_URL", "the PostgreSQL every process uses"),
    ("--schema", "BETTERCOMPUTE_SCHEMA", "the schema holding every table (default bettercompute)"),
    ("--kms-key-file", "BETTERCOMPUTE_KMS_KEY_FILE", "the key file every process shares (created 0600 by setup)"),
    ("--trust-domain", "BETTERCOMPUTE_TRUST_DOMAIN", "the SPIFFE trust domain of node certificates"),
    ("--gateway-address", "BETTERCOMPUTE_GATEWAY_ADDRESS", "host:port that daemons dial"),
    ("--iam-url", "BETTERCOMPUTE_IAM_URL", "the central IAM process's URL (api, worker and gateway)"),
)
_REQUIRED = ("database_url", "kms_key_file", "trust_domain", "gateway_address")
_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _parser() -> argparse.ArgumentParser:
    shared = argparse.ArgumentParser(add_help=False)
    for flag, env, what in _SHARED:
        shared.add_argument(flag, default=os.environ.get(env), help=f"{what} [{env}]")
    parser = argparse.ArgumentParser(
        prog="python -m examples.custom_deployment",
        description="One part of a deployment split into a central IAM, api processes, workers and gateways.",
    )
    parts = parser.add_subparsers(dest="part", required=True, metavar="PART")
    parts.add_parser(
        "setup",
        parents=[shared],
        help="migrate, then mint the root admin and the service account credential (once per deploy)",
    )
    for part, what, port in (
        ("iam", "the central IAM (HTTP), running IAM's jobs", 3000),
        ("api", "an api process (HTTP) asking the central IAM", 3001),
    ):
        served = parts.add_parser(part, parents=[shared], help=what)
        served.add_argument("--host", default="127.0.0.1", help="where to listen (default 127.0.0.1)")
        served.add_argument("--port", type=int, default=port, help=f"where to listen (default {port})")
    parts.add_parser("worker", parents=[shared], help="a worker: controllers, scheduler and sinks; no HTTP")
    gateway = parts.add_parser("gateway", parents=[shared], help="a gateway that node daemons dial (mutual TLS)")
    gateway.add_argument("--host", default="127.0.0.1", help="where to listen (default 127.0.0.1)")
    gateway.add_argument("--port", type=int, help="where to listen (default: the port of --gateway-address)")
    gateway.add_argument("--name", help="the gateway's name in sessions and its certificate (default: host name)")
    return parser


def _deployment(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Deployment:
    missing = [name for name in _REQUIRED if not getattr(args, name)]
    if missing:
        flags = ", ".join("--" + name.replace("_", "-") for name in missing)
        parser.error(f"missing settings: {flags} (or their environment variables, see --help)")
    return Deployment(
        database_url=args.database_url,
        schema=args.schema or "bettercompute",
        kms_key_file=Path(args.kms_key_file),
        trust_domain=args.trust_domain,
        gateway_address=args.gateway_address,
        iam_url=args.iam_url,
        iam_credential=os.environ.get(CREDENTIAL_ENV) or None,
    )


async def _setup(deployment: Deployment) -> None:
    minted = await setup(deployment)
    if minted.root is None or minted.edge is None:
        print("nothing minted: this deployment was set up before (its schema is up to date)", file=sys.stderr)
        return
    print("set up; the credentials below are shown once:", file=sys.stderr)
    print(f"export ROOT_TOKEN={minted.root}")
    print(f"export {CREDENTIAL_ENV}={minted.edge}")


def main(argv: Sequence[str] | None = None) -> None:
    """Run one part until SIGINT or SIGTERM (``setup``: to completion). Exit status 2 for a usage problem, 1 for an
    error, printed as one line."""
    parser = _parser()
    args = parser.parse_args(argv)
    deployment = _deployment(parser, args)
    if args.part in ("api", "worker", "gateway") and (deployment.iam_url is None or deployment.iam_credential is None):
        parser.error(f"the {args.part} process asks the central IAM: give --iam-url and set {CREDENTIAL_ENV}")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run: Callable[[], Awaitable[None]]
    backend_options: dict[str, Any] = {}
    if args.part == "setup":
        run = functools.partial(_setup, deployment)
    elif args.part == "iam":
        run = functools.partial(run_iam, deployment, host=args.host, port=args.port)
    elif args.part == "api":
        run = functools.partial(run_api, deployment, host=args.host, port=args.port)
    elif args.part == "worker":
        run = functools.partial(run_worker, deployment)
    else:
        dialed_port = deployment.gateway_address.rpartition(":")[2]
        if args.port is None and not dialed_port.isdigit():
            parser.error("--gateway-address must be host:port")
        port = args.port if args.port is not None else int(dialed_port)
        name = (_NAME.sub("-", args.name or socket.gethostname()).strip("-") or "gateway")[:128]
        run = functools.partial(run_gateway, deployment, host=args.host, port=port, name=name)
        backend_options = _uvloop()
    try:
        anyio.run(run, backend_options=backend_options)
    except ComputeError as exc:
        print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
        raise SystemExit(1) from None
    except OSError as exc:  # a port taken, a key file that cannot be read
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _uvloop() -> dict[str, Any]:
    """uvloop for the gateway when it is installed: its TLS connections cost about a quarter of the memory of the
    standard loop's, which counts with thousands of daemons."""
    try:
        import uvloop  # noqa: F401 - only whether it is there matters
    except ImportError:
        return {}
    return {"use_uvloop": True}
