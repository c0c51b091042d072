"""What ``bcd join`` is pinned to, from its flags, from a pinned configuration file (``--config``), or both.

The file is a JSON object with the flags' values under their names (underscores for dashes)::

    {"gateway": "gw.example.com:443", "trust_domain": "example.com", "pool": "pool_...",
     "join_key": "<JoinService's X25519 key, base64url>", "ca_pin": "sha256:<64 hex>"}

with ``ca_bundle`` (base64 of the PEM bundle, as ``--ca-bundle``) instead of ``ca_pin`` for the long form. ``pool``
may be left out or null. The token is never in the file: it is a one-time secret, given as ``--token``.

A flag may repeat what the file says; a flag that says something else is refused. Every field is checked (its type,
ASCII only, no NUL or control character, its own shape) and every problem is reported, one line each, before
anything is sent or written.

``bcd node`` reads a second file, the node's own settings (``--config``, default ``/etc/bcd/node.json`` when it
exists; ``NodeSettings``), which says whether and how it runs VM instances::

    {"vm_dir": "/var/lib/bcd/vm", "image_dirs": ["/srv/images"], "vm_subnet": "10.213.0.0/24",
     "vm_network": "bridge", "vm_accel": "tcg", "vm_stop_timeout": 20}

Without ``vm_dir`` (or without the file) the node runs no VMs. See ``docs/vps-node.md``. ``tunnel_local_ports``
lists the ports of services on the node's ``127.0.0.1`` that tunnels may reach (none by default; ``docs/tunnels.md``).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from cryptography import x509

from ._errors import ConfigError, DaemonError
from ._pin import parse_pin
from ._state import NodeConfig

__all__ = [
    "DEFAULT_NODE_CONFIG",
    "FIELDS",
    "NODE_FIELDS",
    "ConfigError",
    "JoinConfig",
    "NodeSettings",
    "node_settings",
    "parse_join_command",
    "read_config_file",
    "resolve",
]

FIELDS = ("gateway", "trust_domain", "pool", "join_key", "ca_bundle", "ca_pin")
NODE_FIELDS = (
    "vm_dir",
    "vm_cache_dir",
    "image_dirs",
    "vm_subnet",
    "vm_network",
    "vm_accel",
    "vm_stop_timeout",
    "vm_vcpu",
    "vm_memory_mib",
    "vm_disk_gib",
    "tunnel_local_ports",
)
DEFAULT_NODE_CONFIG = Path("/etc/bcd/node.json")
_NODE_SETTINGS = "the node settings file"
MAX_FILE_BYTES = 1024 * 1024

_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\]")
_TRUST_DOMAIN = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
_POOL = re.compile(r"[A-Za-z0-9._-]{1,128}")
_JOIN_KEY = re.compile(r"[A-Za-z0-9_-]{43}=?")
_BASE64 = re.compile(r"[A-Za-z0-9+/=]+")


@attrs.frozen(kw_only=True)
class JoinConfig:
    """The checked configuration: a CA bundle (PEM) or a CA pin, never both."""

    gateway: str
    trust_domain: str
    pool: str | None
    join_key: str
    ca_bundle_pem: str | None
    ca_pin: str | None

    def node_config(self) -> NodeConfig:
        """What the state directory keeps of it."""
        return NodeConfig(gateway=self.gateway, trust_domain=self.trust_domain, pool=self.pool, join_key=self.join_key)


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's JSON object, as written (its fields are checked by ``resolve``).

    Raises:
        ConfigError: it cannot be read, is too large, is not UTF-8 JSON, not an object, or repeats a key.
    """
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"{path}: cannot be read ({exc.strerror or type(exc).__name__})"]) from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError([f"{path}: larger than {MAX_FILE_BYTES} bytes"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError([f"{path}: not UTF-8 text"]) from None
    repeated: list[str] = []

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in pairs:
            if key in seen:
                repeated.append(key)
            seen[key] = value
        return seen

    try:
        value = json.loads(text, object_pairs_hook=no_repeats)
    except ValueError as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise ConfigError([f"{path}: not JSON{where}"]) from None
    if not isinstance(value, dict):
        raise ConfigError([f"{path}: expected a JSON object"])
    if repeated:
        raise ConfigError([f"{path}: {_printable(key)}: given more than once" for key in sorted(set(repeated))])
    return value


def resolve(flags: Mapping[str, str | None], file: Mapping[str, Any] | None = None, *, path: str = "") -> JoinConfig:
    """One configuration from the flags (``None``: not given) and the file's object read from ``path``.

    Raises:
        ConfigError: every problem found: an unknown field, a flag that conflicts with the file, a missing or
            malformed value, both or neither of a CA bundle and a CA pin.
    """
    problems: list[str] = []
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    conflicted: set[str] = set()
    for key in file or {}:
        if key not in FIELDS:
            problems.append(f"{path}: {_printable(key)}: not a field of the join configuration ({', '.join(FIELDS)})")
    for name in FIELDS:
        flag = "--" + name.replace("_", "-")
        given = flags.get(name)
        in_file = file is not None and name in file
        if given is not None and file is not None and in_file and file[name] != given:
            problems.append(f"{flag} says otherwise than {name} in {path}: give one or make them agree")
            conflicted.add(name)
        elif given is not None:
            values[name], where[name] = given, flag
        elif file is not None and in_file and not (name == "pool" and file[name] is None):  # null: no pool
            values[name], where[name] = file[name], f"{path}: {name}"
    for name in ("gateway", "trust_domain", "join_key"):
        if name not in values and name not in conflicted:
            problems.append(f"{name}: missing (give --{name.replace('_', '-')} or put it in --config)")
    if "ca_bundle" in values and "ca_pin" in values:
        problems.append(f"{where['ca_bundle']} and {where['ca_pin']}: give a CA bundle or a CA pin, not both")
    elif "ca_bundle" not in values and "ca_pin" not in values and not conflicted & {"ca_bundle", "ca_pin"}:
        problems.append("ca_bundle or ca_pin: missing (give --ca-pin or --ca-bundle, or put one in --config)")
    checked: dict[str, Any] = {}
    for name, value in values.items():
        problem, result = _check(name, value)
        if problem is not None:
            problems.append(f"{where[name]}: {problem}")
        else:
            checked[name] = result
    if problems:
        raise ConfigError(problems)
    return JoinConfig(
        gateway=checked["gateway"],
        trust_domain=checked["trust_domain"],
        pool=checked.get("pool"),
        join_key=checked["join_key"],
        ca_bundle_pem=checked.get("ca_bundle"),
        ca_pin=checked.get("ca_pin"),
    )


def _check(name: str, value: Any) -> tuple[str | None, Any]:
    """``(problem, None)`` or ``(None, the value to use)``."""
    if not isinstance(value, str):
        return f"expected a string, not {_json_type(value)}", None
    if not value:
        return "empty", None
    if not value.isascii() or not value.isprintable():
        return "only printable ASCII is allowed (no NUL, control or non-ASCII character)", None
    if name == "gateway":
        host, sep, port = value.rpartition(":")
        if not sep or not _HOST.fullmatch(host) or not port.isdigit() or not 0 < int(port) < 65536:
            return "must be host:port, the port a number from 1 to 65535", None
        return None, value
    if name == "trust_domain":
        return (None, value) if _TRUST_DOMAIN.fullmatch(value) else ("must be a lower-case DNS name", None)
    if name == "pool":
        return (None, value) if _POOL.fullmatch(value) else ("must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', '-'", None)
    if name == "join_key":
        if not _JOIN_KEY.fullmatch(value):
            return "must be a 32-byte key in URL-safe base64 (43 characters)", None
        return None, value.rstrip("=")
    if name == "ca_pin":
        try:
            return None, parse_pin(value)
        except DaemonError as exc:
            return str(exc), None
    # ca_bundle: base64 of a PEM bundle with at least one certificate
    try:
        if not _BASE64.fullmatch(value):
            raise ValueError
        pem = base64.b64decode(value, validate=True).decode("ascii")
        x509.load_pem_x509_certificates(pem.encode())
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return "must be base64 of a PEM bundle of CA certificates", None
    return None, pem


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _printable(key: str) -> str:
    """A key as it may be shown (JSON-escaped: a key is what the file says, control characters included)."""
    return json.dumps(key)[1:-1][:64]


def parse_join_command(command: str) -> tuple[str, JoinConfig]:
    """The token and the configuration of a ``bcd join ...`` command as ``join-tokens.create`` prints it.

    Raises:
        ConfigError: it is not such a command, or its configuration has problems.
    """
    words: list[str] = []
    for word in shlex.split(command):  # --flag=value (a join key may start with '-') or --flag value
        words += word.split("=", 1) if word.startswith("--") and "=" in word else [word]
    if words[:2] != ["bcd", "join"] or len(words) % 2:
        raise ConfigError(["not a `bcd join --flag value ...` command"])
    given = dict(zip(words[2::2], words[3::2], strict=True))
    token = given.pop("--token", None)
    unknown = sorted(k for k in given if k.removeprefix("--").replace("-", "_") not in FIELDS)
    if token is None or unknown:
        raise ConfigError([f"{flag}: not a flag of bcd join" for flag in unknown] or ["--token: missing"])
    flags = {name: given.get("--" + name.replace("_", "-")) for name in FIELDS}
    return token, resolve(flags)


@attrs.frozen(kw_only=True)
class NodeSettings:
    """``bcd node``'s own settings (see the module docstring).

    Attributes:
        vm_dir: Where VM instances' disks, seeds and logs are kept; ``None``: this node runs no VMs.
        vm_cache_dir: The image cache (default ``<vm_dir>/images``).
        image_dirs: The only directories a ``file://`` image URL may name (default: none, so no local file).
        vm_subnet: The node's VM network, its first address on the node's bridge (default ``10.213.0.0/24``).
        vm_network: ``bridge`` (a tap per instance on the node's Linux bridge; needs root) or ``user`` (QEMU's
            user networking, for a daemon that is not root: the node reaches instances through forwarded ports).
        vm_accel: ``tcg`` (default), or ``kvm``: KVM when ``/dev/kvm`` opens, else TCG.
        vm_stop_timeout: Seconds a guest has to power down before QEMU is told to quit.
        vm_vcpu: The vCPUs the node offers to instances (default: every CPU it has).
        vm_memory_mib: The memory it offers (default: all of it but 1 GiB kept for the host).
        vm_disk_gib: The disk it offers (default: the space free on ``vm_dir``'s file system at start).
        tunnel_local_ports: The ports of services on ``127.0.0.1`` that tunnels may reach (default: none).
    """

    vm_dir: Path | None = None
    vm_cache_dir: Path | None = None
    image_dirs: tuple[Path, ...] = ()
    vm_subnet: ipaddress.IPv4Network = ipaddress.IPv4Network("10.213.0.0/24")  # noqa: RUF009 - immutable
    vm_network: str = "bridge"
    vm_accel: str = "tcg"
    vm_stop_timeout: float = 20.0
    vm_vcpu: int | None = None
    vm_memory_mib: int | None = None
    vm_disk_gib: int | None = None
    tunnel_local_ports: tuple[int, ...] = ()


def node_settings(values: Mapping[str, Any], *, path: str = "") -> NodeSettings:
    """The node's settings from the file's object (read with ``read_config_file``).

    Raises:
        ConfigError: every problem found (an unknown key, a value of the wrong type or shape).
    """
    problems: list[str] = []
    checked: dict[str, Any] = {}
    where = f"{path}: " if path else ""
    for key, value in values.items():
        if key not in NODE_FIELDS:
            problems.append(f"{where}{_printable(key)}: not a node setting ({', '.join(NODE_FIELDS)})")
        elif value is None:
            continue
        elif key in ("vm_dir", "vm_cache_dir"):
            if not isinstance(value, str) or not value.startswith("/"):
                problems.append(f"{where}{key}: must be an absolute path")
            else:
                checked[key] = Path(value)
        elif key == "image_dirs":
            if not isinstance(value, list) or not all(isinstance(v, str) and v.startswith("/") for v in value):
                problems.append(f"{where}image_dirs: must be a list of absolute paths")
            else:
                checked[key] = tuple(Path(v) for v in value)
        elif key == "vm_subnet":
            try:
                subnet = ipaddress.IPv4Network(value)
                if not 16 <= subnet.prefixlen <= 29:
                    raise ValueError
                checked[key] = subnet
            except (ValueError, TypeError):
                problems.append(f"{where}vm_subnet: must be an IPv4 network from /16 to /29, such as 10.213.0.0/24")
        elif key in ("vm_network", "vm_accel"):
            allowed = ("bridge", "user") if key == "vm_network" else ("tcg", "kvm")
            if value not in allowed:
                problems.append(f"{where}{key}: must be {' or '.join(allowed)}")
            else:
                checked[key] = value
        elif key == "tunnel_local_ports":
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65535 for v in value
            ):
                problems.append(f"{where}tunnel_local_ports: must be a list of ports from 1 to 65535")
            else:
                checked[key] = tuple(sorted(set(value)))
        elif key in ("vm_vcpu", "vm_memory_mib", "vm_disk_gib"):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**40:
                problems.append(f"{where}{key}: must be a whole number from 0")
            else:
                checked[key] = value
        elif isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 3600:
            problems.append(f"{where}{key}: must be a number of seconds from 0 to 3600")
        else:
            checked[key] = float(value)
    if problems:
        raise ConfigError(problems, subject=_NODE_SETTINGS)
    return NodeSettings(**checked)
