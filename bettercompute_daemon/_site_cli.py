"""``bcd site``: ``join`` (enrol the site's boot server with a site token), ``run`` (hold the site's boot lease through
the control plane and serve its boot plan) and ``serve-local`` (serve a plan from a file, for tests and debugging).

``run`` is one loop: every ``sync_after_ms`` it calls ``site.sync`` with the boot records heard since the last call.
The answer says whether this process holds the site's boot lease. The holder serves the plan (proxy DHCP, TFTP, HTTP;
``_site.BootServer``); a standby serves nothing and asks again, and takes over once the holder has stopped renewing
for the lease's time to live. A gateway that does not answer keeps the records for the next call; the boot server
goes on serving the last plan meanwhile, until the lease would have expired, then stops (another process may hold it
by then).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

from ._config import _check
from ._errors import CallError, ConfigError, DaemonError
from ._pin import fetch_pinned_bundle
from ._site import DEFAULT_BOOT_FILES, BootPlan, BootRecord, BootServer
from ._site_client import MAX_RECORDS, SiteSync, check_site_token, site_join

__all__ = ["add_site_parser", "run_site", "site_main"]

log = logging.getLogger("bcd.site")

RETRY_SECONDS = 2.0
MAX_PENDING = 10_000
"""The most boot records kept while the control plane cannot be reached."""


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be from 1 to 65535, not {value}")
    return value


def _serving_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interface", required=True, help="the LAN's interface (DHCP is bound to it)")
    parser.add_argument("--address", required=True, help="this host's IPv4 address on that interface")
    parser.add_argument("--cache", type=Path, required=True, help="the directory of the content-addressed file cache")
    parser.add_argument(
        "--boot-files",
        type=Path,
        default=DEFAULT_BOOT_FILES,
        help=f"where undionly.kpxe and ipxe.efi are (default {DEFAULT_BOOT_FILES})",
    )
    parser.add_argument("--http-port", type=_port, default=8080, help="the HTTP port (default 8080)")
    parser.add_argument("--debug", action="store_true", help="log every dropped packet and refused request")


def add_site_parser(add: Any) -> None:
    """Add ``bcd site`` and its commands."""
    site = add("site", help="a bare-metal site's boot server")
    commands = site.add_subparsers(dest="site_command", required=True)
    joining = commands.add_parser(
        "join",
        help="join a site with a one-time site token",
        description="Join a site: the key, certificate and trust are kept in the site folder of the state directory.",
    )
    joining.add_argument("--token", required=True, help="the site token (bcst_<id>.<secret>)")
    joining.add_argument("--gateway", required=True, help="the gateway to dial, host:port")
    trust = joining.add_mutually_exclusive_group(required=True)
    trust.add_argument("--ca-pin", help="sha256:<hex> of the CA certificates the gateway's bundle must match")
    trust.add_argument("--ca-bundle", help="the CA bundle to trust, base64 of its PEM")
    joining.add_argument(
        "--state-dir",
        dest="site_state_dir",
        type=Path,
        default=None,
        help="the state directory (its site folder is written; default: bcd's --state-dir)",
    )
    running = commands.add_parser(
        "run",
        help="hold the site's boot lease and serve its boot plan",
        description="Serve the site's proxy DHCP, TFTP and HTTP boot on one interface while this process holds the"
        " site's boot lease (one active boot server per site; a second process stands by). Needs `bcd site join`"
        " first, and root (ports 67, 69, 4011 and SO_BINDTODEVICE).",
    )
    _serving_options(running)
    running.add_argument(
        "--state-dir",
        dest="site_state_dir",
        type=Path,
        default=None,
        help="the state directory `bcd site join` wrote (default: bcd's --state-dir)",
    )
    running.add_argument("--agent", default=None, help="this process's name in the boot lease (default: random)")
    local = commands.add_parser(
        "serve-local",
        help="serve a boot plan from a JSON file (for tests and debugging)",
        description="Run the site's proxy DHCP, TFTP and HTTP boot server on one interface with the plan in a JSON file"
        ' ({"generation": N, "entries": [...]}); print one JSON line per boot record on stdout. Needs root (ports 67,'
        " 69, 4011 and SO_BINDTODEVICE).",
    )
    _serving_options(local)
    local.add_argument("--plan", type=Path, required=True, help="the boot plan (JSON)")


def site_main(args: argparse.Namespace) -> int:
    """Run the ``bcd site`` command ``args`` names."""
    if getattr(args, "debug", False):
        logging.getLogger("bcd").setLevel(logging.DEBUG)
    if args.site_command == "join":
        return _join(args)
    if args.site_command == "run":
        return _until_signalled(
            run_site(
                args.site_state_dir or args.state_dir,
                interface=args.interface,
                address=args.address,
                cache_dir=args.cache,
                boot_files_dir=args.boot_files,
                http_port=args.http_port,
                agent=args.agent,
            )
        )
    return _serve_local(args)


def _join(args: argparse.Namespace) -> int:
    check_site_token(args.token)
    problems = []
    checked: dict[str, Any] = {}
    for name in ("gateway", "ca_pin", "ca_bundle"):
        if getattr(args, name) is not None:
            problem, checked[name] = _check(name, getattr(args, name))
            if problem is not None:
                problems.append(f"--{name.replace('_', '-')}: {problem}")
    if problems:
        raise ConfigError(problems)
    state_dir = args.site_state_dir or args.state_dir

    async def main() -> int:
        bundle = checked.get("ca_bundle") or await fetch_pinned_bundle(checked["gateway"], checked["ca_pin"])
        identity = await site_join(state_dir=state_dir, token=args.token, gateway=checked["gateway"], bundle_pem=bundle)
        print(f"joined as site {identity.site_id} (tenant {identity.tenant}); kept in {state_dir / 'site'}")
        return 0

    return asyncio.run(main())


def _until_signalled(work: Any) -> int:
    async def main() -> int:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        try:
            result: int = await work
        except asyncio.CancelledError:
            return 0
        return result

    return asyncio.run(main())


def _serve_local(args: argparse.Namespace) -> int:
    try:
        plan = BootPlan.from_json(json.loads(args.plan.read_text()))
    except (KeyError, TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ConfigError([f"--plan {args.plan}: {type(exc).__name__}: {exc}"]) from None

    def emit(record: BootRecord) -> None:
        print(json.dumps(record.to_json(), sort_keys=True), flush=True)

    server = BootServer(
        interface=args.interface,
        address=args.address,
        boot_files_dir=args.boot_files,
        cache_dir=args.cache,
        http_port=args.http_port,
        on_record=emit,
        plan=plan,
    )

    async def serve() -> int:
        await server.run()
        return 0

    return _until_signalled(serve())


def _wire(record: BootRecord) -> dict[str, Any]:
    # The wire's record (docs/metal-wire.md): times in milliseconds.
    return {
        "kind": record.kind,
        "mac": record.mac,
        "system_uuid": record.system_uuid,
        "machine_id": record.machine_id,
        "detail": record.detail[:512],
        "at_ms": int(record.at * 1000),
    }


async def run_site(
    state_dir: Path,
    *,
    interface: str,
    address: str,
    cache_dir: Path,
    boot_files_dir: Path = DEFAULT_BOOT_FILES,
    http_port: int = 8080,
    agent: str | None = None,
) -> int:
    """Hold the site's boot lease and serve its plan until cancelled; 1 when the control plane refuses the site
    (its certificate revoked or expired, the site deleted)."""
    # Bounded: a flood of PXE requests while the control plane is away drops the oldest records, never memory.
    pending: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_PENDING)
    server = BootServer(
        interface=interface,
        address=address,
        cache_dir=cache_dir,
        boot_files_dir=boot_files_dir,
        http_port=http_port,
        on_record=lambda record: pending.append(_wire(record)),
    )
    http_base = f"http://{address}:{http_port}"
    serving = False
    serve_until = 0.0
    async with SiteSync(state_dir, agent) as sync:
        log.info("site agent %s starting", sync.agent)
        try:
            while True:
                batch = list(itertools.islice(pending, MAX_RECORDS))
                try:
                    answer = await sync.sync(http_base, batch)
                except CallError as exc:
                    if not exc.retryable:
                        log.error("the control plane refused this site: %s (%s)", exc.message, exc.code)
                        return 1
                    log.warning("site.sync failed, retrying: %s", exc.message)
                    answer = None
                except DaemonError as exc:
                    log.warning("site.sync failed, retrying: %s", exc)
                    answer = None
                if answer is None:
                    if serving and time.monotonic() > serve_until:
                        log.warning("the boot lease may have passed to another agent: serving stops")
                        await server.stop()
                        serving = False
                    await asyncio.sleep(RETRY_SECONDS)
                    continue
                for _ in batch:
                    pending.popleft()
                if answer.active:
                    serve_until = time.monotonic() + answer.lease_ttl_ms / 1000
                    try:
                        server.set_plan(BootPlan.from_json(answer.plan()))
                    except (KeyError, TypeError, ValueError) as exc:
                        # One bad entry must not stop every machine's boot: the last good plan stays in place.
                        log.error("the control plane's boot plan is malformed (kept the last one): %s", exc)
                    if not serving:
                        await server.start()
                        serving = True
                        log.info("holding the boot lease: serving on %s (%s)", interface, http_base)
                else:
                    pending.clear()
                    if serving:
                        await server.stop()
                        serving = False
                    log.info("standing by: %s holds the boot lease", answer.holder)
                await asyncio.sleep(answer.sync_after_ms / 1000)
        finally:
            if serving:
                await server.stop()
