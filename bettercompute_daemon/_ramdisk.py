"""``bcd ramdisk``: the agent of the ramdisk a bare-metal machine boots over the network to be commissioned, wiped
or deployed (``docs/metal-wire.md``).

Configuration. ``--token``, ``--gateway`` and ``--ca-pin`` (or ``--ca-bundle``), or else the kernel command line
the boot server gave the ramdisk (``--cmdline-file``, ``/proc/cmdline`` by default): ``bc.token=``,
``bc.gateway=host:port`` and ``bc.ca_pin=sha256:<hex>``, each word splittable by spaces unless double-quoted, as the
kernel reads it. A flag wins over the command line.

Join. A fresh key and CSR, and the machine's hardware claims (the same ``Inventory`` claims ``bcd join`` sends, so the
hardware key the control plane derives is the same, with ``system_uuid`` and ``serial`` always present), sent to
``ramdisk.join`` over TLS that trusts only the pinned CA bundle, without a client certificate. The certificate (role
``ramdisk``, at most two hours) and its key stay in this process's memory: a ramdisk keeps nothing.

Tasks. Then ``ramdisk.task`` over mutual TLS with that certificate, in a loop: each call carries the report of the
task before (``null`` the first time) and answers the next task, or none and when to ask again
(``poll_after_ms``). ``diagnose``, ``wipe`` and ``deploy`` are run as ``Machine`` says. A disk is wiped or written
only if this ramdisk named it in its last ``diagnose``. Each report is signed by the ramdisk's key
(``identity.ramdisk_report_message``).

End. An answer with no task and ``done`` set ends the agent (exit status 0). Once a ``deploy`` succeeded and its
report was taken, the first answer with no task runs the reboot command (``--reboot-command``, ``systemctl reboot``
by default) and the agent ends with status 0 (1 if the command failed). A refusal that asking again cannot change
(an expired certificate, a report the control plane rejects) ends it with status 1; a gateway that does not answer,
or a refusal marked retryable, is asked again with exponential backoff and jitter.

Neither the token nor the key is ever logged.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import random
import re
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
from grpclib.client import Channel

from ._agent import split_address
from ._call import call, certificate_for, client_context
from ._config import _check
from ._disks import (
    Disk,
    UrlOpener,
    declared_disks,
    default_opener,
    discover_disks,
    smart_health,
    tool,
    wipe,
    write_image,
)
from ._errors import CallError, ConfigError, DaemonError, GatewayUnreachable
from ._inventory import Inventory
from ._pin import fetch_pinned_bundle
from .identity import NodeKey, ramdisk_report_message

__all__ = [
    "BLOCK_CLOUD_INIT_DIR",
    "CMDLINE",
    "DEFAULT_REBOOT_COMMAND",
    "Machine",
    "Outcome",
    "Ramdisk",
    "RamdiskSettings",
    "parse_cmdline",
    "ramdisk_claims",
    "resolve_settings",
    "signed_report",
]

log = logging.getLogger("bcd")

CMDLINE = Path("/proc/cmdline")
DEFAULT_REBOOT_COMMAND = "systemctl reboot"
BLOCK_CLOUD_INIT_DIR = Path("/run/bcd-ramdisk/cidata")
"""Where the cloud-init seed of an image written to a block device goes without ``--cloud-init-dir`` (the image's
own boot hook has to carry it further; see ``Machine``)."""

_SEPARATORS = frozenset(" \t\n\r\v\f")
_MACHINE = re.compile(r"[A-Za-z0-9._-]{1,128}")
_TOKEN = re.compile(r"bcrt_[\x21-\x7e]{1,500}")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_POLL_FLOOR_MS = 100
_POLL_CEILING_MS = 60_000
_POLL_DEFAULT_MS = 2_000
_BACKOFF_FIRST = 1.0
_BACKOFF_LAST = 30.0

T = TypeVar("T")


def parse_cmdline(text: str) -> dict[str, str]:
    """The ``bc.*`` parameters of a kernel command line, the last of a repeated one winning.

    Words are split at white space outside double quotes; the quotes themselves are dropped (``bc.x="a b"`` and
    ``"bc.x=a b"`` both give ``a b``); an unterminated quote runs to the end. A NUL ends a word and any quote. Words
    that are not ``bc.<name>=<value>`` are ignored.
    """
    words: list[str] = []
    word: list[str] = []
    quoted = False
    for char in text:
        if char == "\0" or (char in _SEPARATORS and not quoted):
            if word:
                words.append("".join(word))
            word, quoted = [], False
        elif char == '"':
            quoted = not quoted
        else:
            word.append(char)
    if word:
        words.append("".join(word))
    params: dict[str, str] = {}
    for item in words:
        key, sep, value = item.partition("=")
        if sep and key.startswith("bc.") and len(key) > 3:
            params[key] = value
    return params


@attrs.frozen(kw_only=True)
class RamdiskSettings:
    """Where the ramdisk joins and what it trusts: a CA bundle (PEM) or a CA pin, never neither."""

    token: str = attrs.field(repr=False)
    gateway: str
    ca_pin: str | None
    ca_bundle_pem: str | None = attrs.field(repr=False)
    machine: str | None = None
    """The machine the token was minted for (``bc.machine``), which ``ramdisk.join`` names."""


def resolve_settings(flags: Mapping[str, str | None], cmdline: Mapping[str, str]) -> RamdiskSettings:
    """The settings from the flags (``token``, ``gateway``, ``ca_pin``, ``ca_bundle``), else from the kernel command
    line's ``bc.token``, ``bc.gateway`` and ``bc.ca_pin``.

    Raises:
        ConfigError: every problem, one line each (a value is never shown: it may be the token).
    """
    problems: list[str] = []
    values: dict[str, Any] = {}
    for name in ("token", "gateway", "ca_pin", "ca_bundle"):
        given = flags.get(name)
        where = "--" + name.replace("_", "-")
        if given is None and name != "ca_bundle":
            given = cmdline.get(f"bc.{name}")
            where = f"bc.{name}"
        if given is None:
            continue
        if name == "token":
            if not _TOKEN.fullmatch(given):
                problems.append(f"{where}: not a ramdisk token (bcrt_<id>.<secret>, printable ASCII)")
            else:
                values[name] = given
            continue
        problem, value = _check(name, given)
        if problem is not None:
            problems.append(f"{where}: {problem}")
        else:
            values[name] = value
    if "token" not in values and not any(p.startswith(("--token", "bc.token")) for p in problems):
        problems.append("token: missing (give --token, or bc.token= on the kernel command line)")
    if "gateway" not in values and not any(p.startswith(("--gateway", "bc.gateway")) for p in problems):
        problems.append("gateway: missing (give --gateway, or bc.gateway= on the kernel command line)")
    if "ca_bundle" in values and flags.get("ca_pin") is not None:
        problems.append("--ca-bundle and --ca-pin: give a CA bundle or a CA pin, not both")
    elif "ca_bundle" not in values and "ca_pin" not in values and not any("ca_" in p or "ca-" in p for p in problems):
        problems.append("ca_pin: missing (give --ca-pin or --ca-bundle, or bc.ca_pin= on the kernel command line)")
    if problems:
        raise ConfigError(problems)
    bundle = values.get("ca_bundle")
    machine = flags.get("machine") or cmdline.get("bc.machine")
    if machine is not None and not _MACHINE.fullmatch(machine):
        raise ConfigError(["machine: not a machine id (1 to 128 of A-Z, a-z, 0-9, '.', '_', '-')"])
    return RamdiskSettings(
        token=values["token"],
        gateway=values["gateway"],
        ca_pin=None if bundle is not None else values.get("ca_pin"),
        ca_bundle_pem=bundle,
        machine=machine,
    )


def ramdisk_claims(inventory: Inventory) -> dict[str, Any]:
    """The claims ``ramdisk.join`` sends: ``inventory``'s (as ``bcd join`` sends them), with ``system_uuid`` (lower
    case) and ``serial`` always present, ``null`` when unknown."""
    claims = dict(inventory.claims)
    uuid = claims.get("system_uuid")
    claims["system_uuid"] = uuid.lower() if isinstance(uuid, str) else None
    claims.setdefault("serial", None)
    return claims


@attrs.frozen(kw_only=True)
class Outcome:
    """A task's outcome, as its report says it."""

    ok: bool
    result: dict[str, Any]
    error: str | None = None


def signed_report(
    key: NodeKey, *, machine_id: str, task_id: str, kind: str, outcome: Outcome, signed_at_ms: int | None = None
) -> dict[str, Any]:
    """The report of a task, signed by ``key`` (``docs/metal-wire.md``)."""
    at = round(time.time() * 1000) if signed_at_ms is None else signed_at_ms
    message = ramdisk_report_message(
        machine_id=machine_id,
        task_id=task_id,
        kind=kind,
        ok=outcome.ok,
        result=outcome.result,
        error=outcome.error,
        signed_at_ms=at,
    )
    return {
        "task_id": task_id,
        "kind": kind,
        "ok": outcome.ok,
        "result": outcome.result,
        "error": outcome.error,
        "signed_at_ms": at,
        "signature": base64.b64encode(key.sign(message)).decode("ascii"),
    }


class Machine:
    """The work of the tasks, on this machine (each method blocks: the agent runs them in a thread).

    Args:
        inventory: What the machine is (``diagnose``'s ``inventory`` is its sections).
        disks: The disks declared with ``--disk``; ``None`` to find them in ``/sys/block`` at each ``diagnose``.
        cloud_init_dir: Where ``deploy`` writes the cloud-init NoCloud seed (``user-data``, ``meta-data``). Without
            it: a ``cidata`` folder beside a disk that is a regular file, ``BLOCK_CLOUD_INIT_DIR`` for a block
            device (a ramdisk cannot yet write a seed partition: the image's first boot has to find it there).
        smartctl: The ``smartctl`` program (``None``: SMART is unsupported).
        blkdiscard: The ``blkdiscard`` program (``None``: no discard after a wipe).
        opener: How an image's URL is opened.
    """

    def __init__(
        self,
        inventory: Inventory,
        *,
        disks: Sequence[Disk] | None = None,
        cloud_init_dir: Path | None = None,
        smartctl: str | None = None,
        blkdiscard: str | None = None,
        opener: UrlOpener = default_opener,
    ) -> None:
        self.inventory = inventory
        self.claims = ramdisk_claims(inventory)
        self._declared = list(disks) if disks is not None else None
        self._cloud_init_dir = cloud_init_dir
        self._smartctl = smartctl
        self._blkdiscard = blkdiscard
        self._opener = opener
        self.reported: dict[str, Disk] = {}
        """The disks named by the last ``diagnose``: the only ones ``wipe`` and ``deploy`` touch."""

    def run(self, task: Mapping[str, Any]) -> Outcome:
        """Run one task (``{"task_id", "kind", "params"}``)."""
        kind, params = task.get("kind"), task.get("params")
        if not isinstance(params, dict):
            return Outcome(ok=False, result={}, error="invalid_params")
        if kind == "diagnose":
            return self.diagnose()
        if kind == "wipe":
            return self.wipe(params)
        if kind == "deploy":
            return self.deploy(params)
        return Outcome(ok=False, result={}, error="unknown_kind")

    def diagnose(self) -> Outcome:
        """The claims, the inventory sections, and each disk's size and SMART health."""
        disks = self._declared if self._declared is not None else discover_disks()
        self.reported = {disk.name: disk for disk in disks}
        return Outcome(
            ok=True,
            result={
                "claims": self.claims,
                "inventory": dict(self.inventory.sections),
                # What diag.nvml reads (NVML again, or the declared health): the control plane judges it by the pool's
                # node policy, as it judges a joining node's acceptance check.
                "health": self.inventory.current_health(),
                "disks": [
                    {"name": d.name, "size_bytes": d.size_bytes(), "smart": smart_health(d, self._smartctl)}
                    for d in disks
                ],
            },
        )

    def wipe(self, params: Mapping[str, Any]) -> Outcome:
        """Wipe the disks named, all of them reported by ``diagnose``; else none is touched (``unknown_disk``)."""
        names = params.get("disks")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return Outcome(ok=False, result={"disks": []}, error="invalid_params")
        unknown = [n for n in names if n not in self.reported]
        if unknown:
            log.error("wipe refused: %d of its disks were not reported by this ramdisk's diagnose", len(unknown))
            refused = [{"name": n, "method": "refused" if n in unknown else "none", "ok": False} for n in names]
            return Outcome(ok=False, result={"disks": refused}, error="unknown_disk")
        done = []
        for name in names:
            outcome = wipe(self.reported[name], self._blkdiscard)
            if outcome.problem:
                log.error("wipe of %s failed: %s", name, outcome.problem)
            done.append({"name": name, "method": outcome.method, "ok": outcome.ok})
        ok = all(d["ok"] for d in done)
        return Outcome(ok=ok, result={"disks": done}, error=None if ok else "wipe_failed")

    def deploy(self, params: Mapping[str, Any]) -> Outcome:
        """Write the image to the disk, check it, and write the cloud-init seed."""
        name, image, seed = params.get("disk"), params.get("image"), params.get("cloud_init")
        empty = {"disk": name if isinstance(name, str) else None, "written_bytes": 0, "sha256": None}
        if not isinstance(name, str) or not isinstance(image, dict) or not isinstance(seed, dict | None):
            return Outcome(ok=False, result=empty, error="invalid_params")
        url, sha256, size = image.get("url"), image.get("sha256"), image.get("size")
        if (
            not isinstance(url, str)
            or not isinstance(sha256, str)
            or not _SHA256.fullmatch(sha256)
            or not (size is None or (isinstance(size, int) and not isinstance(size, bool) and size >= 0))
        ):
            return Outcome(ok=False, result=empty, error="invalid_params")
        user_data = meta_data = None
        if seed is not None:
            user_data, meta_data = seed.get("user_data"), seed.get("meta_data")
            if not isinstance(user_data, str) or not isinstance(meta_data, str):
                return Outcome(ok=False, result=empty, error="invalid_params")
        disk = self.reported.get(name)
        if disk is None:
            log.error("deploy refused: its disk was not reported by this ramdisk's diagnose")
            return Outcome(ok=False, result=empty, error="unknown_disk")
        written = write_image(disk, url, sha256=sha256, size=size, opener=self._opener)
        result = {"disk": name, "written_bytes": written.written_bytes, "sha256": written.sha256}
        if written.error is not None:
            log.error("deploy to %s failed (%s): %s", name, written.error, written.problem)
            return Outcome(ok=False, result=result, error=written.error)
        if user_data is not None and meta_data is not None:
            folder = self.cloud_init_dir(disk)
            try:
                _write_seed(folder, user_data=user_data, meta_data=meta_data)
            except OSError as exc:
                log.error("the cloud-init seed could not be written to %s: %s", folder, type(exc).__name__)
                return Outcome(ok=False, result=result, error="cloud_init_failed")
        log.info("deployed %d bytes to %s", written.written_bytes, name)
        return Outcome(ok=True, result=result)

    def cloud_init_dir(self, disk: Disk) -> Path:
        """Where the seed of an image on ``disk`` goes (see the class docstring)."""
        if self._cloud_init_dir is not None:
            return self._cloud_init_dir
        return BLOCK_CLOUD_INIT_DIR if disk.block else disk.path.parent / "cidata"


def _write_seed(folder: Path, *, user_data: str, meta_data: str) -> None:
    """The NoCloud seed files, readable by their owner only (user data may hold secrets)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name, content in (("user-data", user_data), ("meta-data", meta_data)):
        path = folder / name
        path.unlink(missing_ok=True)
        path.touch(mode=0o600)
        path.write_text(content)


class Ramdisk:
    """The agent: join, then ask for tasks and run them until told it is done (see the module docstring).

    Args:
        settings: Where to join and what to trust.
        machine: What runs the tasks.
        reboot_command: Run once a deploy succeeded and nothing more is asked.
        sleep: How to wait (between polls, before retrying).
        join_patience: Seconds the join keeps retrying a gateway that does not answer.
    """

    def __init__(
        self,
        settings: RamdiskSettings,
        machine: Machine,
        *,
        reboot_command: Sequence[str] = tuple(shlex.split(DEFAULT_REBOOT_COMMAND)),
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        join_patience: float = 600.0,
    ) -> None:
        self._settings = settings
        self._machine = machine
        self._reboot = list(reboot_command)
        self._sleep = sleep
        self._join_patience = join_patience

    async def run(self) -> int:
        """Join and work; the exit status."""
        try:
            key, machine_id, channel, expires = await self._join()
        except DaemonError as exc:
            log.error("the ramdisk could not join: %s", exc)
            return 1
        try:
            return await self._work(key, machine_id, channel, expires)
        finally:
            channel.close()

    async def _persist(self, what: str, attempt: Callable[[], Awaitable[T]], *, patience: float | None) -> T:
        """``attempt`` until it succeeds, retrying what may pass (within ``patience`` seconds, when given)."""
        started = time.monotonic()
        backoff = _BACKOFF_FIRST
        while True:
            try:
                return await attempt()
            except CallError as exc:
                if not exc.retryable:
                    raise
                problem: DaemonError = exc
            except GatewayUnreachable as exc:
                problem = exc
            if patience is not None and time.monotonic() - started > patience:
                raise problem
            delay = backoff * random.uniform(0.5, 1.5)  # noqa: S311 - jitter, not a secret
            log.warning("%s: %s; trying again in %.1f s", what, problem, delay)
            await self._sleep(delay)
            backoff = min(backoff * 2, _BACKOFF_LAST)

    async def _trust(self) -> str:
        if self._settings.ca_bundle_pem is not None:
            return self._settings.ca_bundle_pem

        async def fetch() -> str:
            try:
                return await fetch_pinned_bundle(self._settings.gateway, self._settings.ca_pin or "")
            except DaemonError as exc:  # unreachable, or not the pinned bundle (perhaps not yet the right gateway)
                raise GatewayUnreachable(str(exc)) from None

        return await self._persist("the CA bundle", fetch, patience=self._join_patience)

    async def _join(self) -> tuple[NodeKey, str, Channel, float]:
        bundle = await self._trust()
        host, port = split_address(self._settings.gateway)
        key = NodeKey()
        claims = self._machine.claims
        csr_pem = key.csr_pem(str(claims.get("hostname") or "ramdisk"))
        request = {"token": self._settings.token, "csr_pem": csr_pem, "claims": claims}
        if self._settings.machine is not None:
            request["machine_id"] = self._settings.machine
        opening = Channel(host, port, ssl=client_context(bundle))
        try:
            answer = await self._persist(
                "ramdisk.join", lambda: call(opening, "ramdisk.join", request), patience=self._join_patience
            )
        finally:
            opening.close()
        machine_id, certificate_pem, trust_pem, expires = _joined(answer, key)
        log.info("joined as the ramdisk of machine %s", machine_id)
        context = client_context(
            trust_pem + "\n" + bundle, certificate_pem=certificate_pem, key_pem=key.private_key_pem()
        )
        return key, machine_id, Channel(host, port, ssl=context), expires

    async def _work(self, key: NodeKey, machine_id: str, channel: Channel, expires: float) -> int:
        report: dict[str, Any] | None = None
        reboot = False
        while True:

            def ask(sent: dict[str, Any] | None = report) -> Awaitable[dict[str, Any]]:
                return call(channel, "ramdisk.task", {"report": sent})

            try:  # retried until the certificate expires: after that, no answer can come
                answer = await self._persist("ramdisk.task", ask, patience=max(0.0, expires - time.time()))
            except DaemonError as exc:
                log.error("the control plane did not take this ramdisk's call: %s", exc)
                return 1
            report = None
            task = answer.get("task")
            if task is None:
                if reboot:
                    return await self._reboot_now()
                if answer.get("done") is True:
                    log.info("the control plane needs nothing more from this ramdisk")
                    return 0
                await self._sleep(_poll_after(answer) / 1000)
                continue
            if not isinstance(task, dict) or not isinstance(task.get("task_id"), str) or not task.get("kind"):
                log.error("the control plane answered a task this ramdisk cannot read")
                return 1
            kind = str(task["kind"])
            log.info("task %s: %s", task["task_id"], kind)
            outcome = await asyncio.to_thread(self._machine.run, task)
            log.info("task %s: %s %s", task["task_id"], kind, "done" if outcome.ok else f"failed ({outcome.error})")
            report = signed_report(key, machine_id=machine_id, task_id=task["task_id"], kind=kind, outcome=outcome)
            reboot = reboot or (kind == "deploy" and outcome.ok)

    async def _reboot_now(self) -> int:
        log.info("the image is deployed; rebooting (%s)", shlex.join(self._reboot))
        try:
            process = await asyncio.create_subprocess_exec(*self._reboot)
            status = await process.wait()
        except OSError as exc:
            log.error("the reboot command could not run: %s", type(exc).__name__)
            return 1
        if status != 0:
            log.error("the reboot command failed with status %d", status)
            return 1
        return 0


def _poll_after(answer: Mapping[str, Any]) -> int:
    wait = answer.get("poll_after_ms")
    if not isinstance(wait, int) or isinstance(wait, bool):
        return _POLL_DEFAULT_MS
    return min(max(wait, _POLL_FLOOR_MS), _POLL_CEILING_MS)


def _joined(answer: Mapping[str, Any], key: NodeKey) -> tuple[str, str, str, float]:
    """The machine id, the certificate with its chain, the trust bundle of ``ramdisk.join``'s answer, and when the
    certificate expires (seconds since the epoch).

    Raises:
        DaemonError: the answer lacks one, or its certificate is not for this key or this machine's ramdisk.
    """
    machine_id, certificate, chain, trust = (
        answer.get(name) for name in ("machine_id", "certificate_pem", "chain_pem", "trust_bundle_pem")
    )
    if not (
        isinstance(machine_id, str)
        and machine_id
        and isinstance(certificate, str)
        and isinstance(chain, str)
        and isinstance(trust, str)
    ):
        raise DaemonError("ramdisk.join answered without a machine id, a certificate or a trust bundle")
    loaded = certificate_for(certificate, key, f"/ramdisk/{machine_id}")
    expires = loaded.not_valid_after_utc.timestamp()
    return machine_id, certificate.rstrip("\n") + "\n" + chain, trust, expires


async def run_ramdisk(
    settings: RamdiskSettings,
    machine: Machine,
    *,
    reboot_command: Sequence[str],
) -> int:
    """``bcd ramdisk``: the exit status."""
    return await Ramdisk(settings, machine, reboot_command=reboot_command).run()


def build_machine(
    inventory: Inventory, *, disks: Sequence[str], cloud_init_dir: Path | None, opener: UrlOpener = default_opener
) -> Machine:
    """The ``Machine`` of ``bcd ramdisk``'s flags (``smartctl`` and ``blkdiscard`` found on ``PATH``).

    Raises:
        ValueError: a declared disk is neither a block device nor a regular file.
    """
    return Machine(
        inventory,
        disks=declared_disks(disks) if disks else None,
        cloud_init_dir=cloud_init_dir,
        smartctl=tool("smartctl"),
        blkdiscard=tool("blkdiscard"),
        opener=opener,
    )
