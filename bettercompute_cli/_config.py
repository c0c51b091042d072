"""The command's configuration: a TOML file, overridden by environment variables, overridden by flags.

``load_config`` is a pure function of the file's text, the environment mapping and the flags given, so every rule
here is unit-testable. Every problem is collected and reported at once, each naming its key and where it came from;
a value is never echoed when it may hold a secret (the database and notifier URLs, the IAM credential).
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

__all__ = [
    "API_ROLE",
    "CONFIG_ENV",
    "DATABASE_URL_ENV",
    "ENV_PREFIX",
    "GATEWAY_ROLE",
    "IAM_CREDENTIAL_ENV",
    "IAM_URL_ENV",
    "KEYS",
    "KMS_KEY_FILE_ENV",
    "WORKER_ROLES",
    "Config",
    "ConfigError",
    "load_config",
    "parse_roles",
]

ENV_PREFIX = "BETTERCOMPUTE_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
DATABASE_URL_ENV = ENV_PREFIX + "DATABASE_URL"
IAM_URL_ENV = ENV_PREFIX + "IAM_URL"
IAM_CREDENTIAL_ENV = ENV_PREFIX + "IAM_CREDENTIAL"
KMS_KEY_FILE_ENV = ENV_PREFIX + "KMS_KEY_FILE"
API_ROLE = "api"
GATEWAY_ROLE = "gateway"
WORKER_ROLES = ("controllers", "scheduler", "sinks", "iam")
_ROLE_NAMES = ("all", API_ROLE, *WORKER_ROLES, GATEWAY_ROLE)

KEYS = (
    "database_url",
    "schema",
    "database_role_prefix",
    "host",
    "port",
    "roles",
    "pgbouncer",
    "instance",
    "iam_url",
    "iam_credential",
    "kms_key_file",
    "kms_previous_key_file",
    "trust_domain",
    "gateway_address",
    "gateway_host",
    "gateway_port",
    "internal_host",
    "internal_port",
    "internal_address",
    "gateway_token",
    "gateway_state_dir",
    "metrics_host",
    "metrics_port",
    "lease_ttl_seconds",
    "notify_url",
    "webhooks_allow_private",
    "max_queued",
    "tunnel_gateway",
    "tunnel_streams_per_tenant",
    "tunnel_bytes_per_second",
)
"""The keys of the file; each is also ``BETTERCOMPUTE_<KEY>`` in the environment."""

_SCHEMA = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_ROLE_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,49}")
_TRUST_DOMAIN = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
_ADDRESS = re.compile(r"[A-Za-z0-9.-]{1,253}:[0-9]{1,5}")
_URL_SCHEMES = ("postgresql://", "postgres://", "postgresql+psycopg://")
_LEASE_TTL_SECONDS_RANGE = (1, 3600)
"""Allowed lease TTLs: ``Options`` refuses less than a second, and past an hour a dead worker's shards would stall
for longer than anyone would choose."""
_MAX_QUEUED = 100_000
"""The most requests ``max_queued`` lets wait (``Options`` refuses more)."""
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class ConfigError(ValueError):
    """The configuration is wrong; ``problems`` lists each problem, naming its key and its source."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@attrs.frozen(kw_only=True)
class Config:
    """What the command runs with. Defaults suit a developer's machine.

    Attributes:
        database_url: The PostgreSQL URL; ``None`` when not configured (only ``dev`` can do without one).
        schema: The PostgreSQL schema holding every table.
        database_role_prefix: ``migrate`` makes (where missing) and grants the roles ``<prefix>_api``,
            ``<prefix>_worker`` and ``<prefix>_gateway``, one per process mode; ``None``: the schema's name. Each
            process then connects as the role of its mode (``docs/operations.md``).
        host: Where ``serve`` and ``dev`` listen.
        port: Where ``serve`` and ``dev`` listen.
        roles: What ``serve`` runs (``all``, ``api``, worker roles).
        pgbouncer: Connect through PgBouncer in transaction mode (no server-side prepared statements).
        instance: This process's name in leases and worker rows (host and pid by default).
        iam_url: A central control plane whose IAM ``serve`` uses (``RemoteIam``) instead of an embedded one.
        iam_credential: This process's own credential for the central IAM; set exactly when ``iam_url`` is.
        kms_key_file: The ``LocalKeyKms`` key file that seals webhook signing secrets; with it, ``serve`` and
            ``migrate`` register the ``webhooks`` group and its sender. Every process of one deployment that runs the
            API or ``sinks`` must read the same file. ``dev`` defaults to ``./.bettercompute/kms.key``.
        kms_previous_key_file: The key file ``kms_key_file`` replaced, during a KMS key rotation: what it sealed
            still opens (``KmsRing``) while ``keys rewrap`` seals every stored blob again under the new key. Remove
            it once the re-wrap is done and a day has passed (``docs/operations.md``, "Rotating keys").
        trust_domain: The SPIFFE trust domain of node identities; with ``gateway_address`` and ``kms_key_file`` it
            turns on JoinService and the node CA (``dev`` defaults to ``dev.localhost``).
        gateway_address: ``host:port`` daemons dial, pinned in the join command (``dev``: ``<host>:7443``).
        gateway_host: Where the gateway listens (``host`` by default); behind a load balancer, the address the
            balancer forwards to, while ``gateway_address`` stays what daemons dial.
        gateway_port: The port the gateway listens on (the port of ``gateway_address`` by default).
        internal_host: Where an api process's internal listener listens (``host`` by default).
        internal_port: With node identity on, an api process listens here for gateway processes (the internal
            channel: gRPC over mutual TLS, gateway certificates only); ``None``: no listener, gateways run only in
            an api process.
        internal_address: ``host:port`` of an api process's internal listener, which a gateway-only process
            (``serve --roles gateway``) asks for joins, renewals, secrets and its own certificate; several,
            separated by commas, to go on through another api process while one is down. Such a process holds no
            KMS key: it needs this instead of ``kms_key_file``.
        gateway_token: A one-time enrolment token (``better-compute gateways token``) for a gateway-only process
            whose state directory holds no current certificate; never echoed.
        gateway_state_dir: Where a gateway-only process keeps its key and certificate
            (``$XDG_STATE_HOME/better-compute/gateway-<name>`` by default).
        metrics_host: Where the metrics listener listens (``host`` by default); used only with ``metrics_port``.
        metrics_port: A listener of its own for Prometheus (``GET /metrics``, and ``GET /healthz``), in every process
            mode; the processes without the HTTP API have no other. On a process that serves the API, ``/metrics``
            then moves there: the API's port answers it ``NOT_FOUND``. ``None`` (the default): no listener, and the
            API's port serves ``/metrics``.
        lease_ttl_seconds: How long a worker's leases and membership rows live unrenewed (``Options.lease_ttl``):
            a dead worker's shards move on after about this long; leases are renewed every third of it.
        notify_url: A PostgreSQL URL straight to the server (not through a pooler) for the notifier's LISTEN and
            NOTIFY connections; ``None`` uses ``database_url``, unless ``pgbouncer`` is on, when there is no notifier
            and the worker loops only poll.
        webhooks_allow_private: Let webhook subscriptions reach internal destinations: loopback, private networks,
            link-local (the cloud metadata service at ``169.254.169.254``) and other addresses that are not
            globally reachable (``WebhookSettings.allow_private_destinations``). Off, ``serve`` refuses them at
            ``webhooks.create`` and before every attempt; ``dev`` allows loopback alone. On, any tenant that may
            create a webhook can make this process POST into the operator's network (SSRF): set it only where
            every such tenant is trusted that far.
        max_queued: API requests that may wait for a free slot (``Options.max_queued``); one more is shed with 503
            and ``Retry-After``. ``None``: as many as run at once (``max_in_flight``).
        tunnel_gateway: ``host:port`` a tunnel's client dials (``nodes.tunnel``'s answer); ``gateway_address`` by
            default (``docs/tunnels.md``).
        tunnel_streams_per_tenant: Tunnels one tenant may hold open on this process's gateway at once (16).
        tunnel_bytes_per_second: The bandwidth one tenant's tunnels share on this process's gateway, each way
            (8 MiB/s).
    """

    database_url: str | None = attrs.field(default=None, repr=False)
    schema: str = "bettercompute"
    database_role_prefix: str | None = None
    host: str = "127.0.0.1"
    port: int = 3000
    roles: tuple[str, ...] = ("all",)
    pgbouncer: bool = False
    instance: str | None = None
    iam_url: str | None = None
    iam_credential: str | None = attrs.field(default=None, repr=False)
    kms_key_file: Path | None = None
    kms_previous_key_file: Path | None = None
    trust_domain: str | None = None
    gateway_address: str | None = None
    gateway_host: str | None = None
    gateway_port: int | None = None
    internal_host: str | None = None
    internal_port: int | None = None
    internal_address: str | None = None
    gateway_token: str | None = attrs.field(default=None, repr=False)
    gateway_state_dir: Path | None = None
    metrics_host: str | None = None
    metrics_port: int | None = None
    lease_ttl_seconds: float = 15.0
    notify_url: str | None = attrs.field(default=None, repr=False)
    webhooks_allow_private: bool = False
    max_queued: int | None = None
    tunnel_gateway: str | None = None
    tunnel_streams_per_tenant: int = 16
    tunnel_bytes_per_second: int = 8 * 1024 * 1024


def parse_roles(value: str | list[Any] | tuple[Any, ...]) -> tuple[str, ...]:
    """Role names from ``"api,sinks"`` or a list; unknown names raise ``ValueError`` naming them."""
    items = value.split(",") if isinstance(value, str) else list(value)
    roles: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"expected role names, got {type(item).__name__}")
        name = item.strip().lower()
        if name and name not in roles:
            roles.append(name)
    if not roles:
        raise ValueError("no role given")
    unknown = [r for r in roles if r not in _ROLE_NAMES]
    if unknown:
        raise ValueError(f"unknown role(s) {', '.join(unknown)}; choose from {', '.join(_ROLE_NAMES)}")
    return tuple(roles)


def _check(key: str, value: Any, where: str, *, from_env: bool = False) -> tuple[Any, str | None]:
    """The value converted for ``key``, or a problem naming ``where`` it came from.

    Environment values are strings and are parsed (``"3000"``, ``"true"``); file and flag values must already
    have the right type.
    """
    if key in ("database_url", "notify_url"):
        return _check_database_url(value, where)
    if key == "lease_ttl_seconds":
        return _check_seconds(value, where, from_env=from_env)
    if key == "iam_url":
        if not isinstance(value, str):
            return None, f"{where} must be a string"
        return _check_iam_url(value.strip(), where)
    if key == "iam_credential":
        if not isinstance(value, str) or not value.strip():
            # Never repeat it: it is a secret.
            return None, f"{where} must be a non-empty string"
        return value.strip(), None
    if key == "gateway_token":
        if not isinstance(value, str) or not value.strip():
            return None, f"{where} must be a non-empty string"  # never repeated: it is a secret
        return value.strip(), None
    if key in ("kms_key_file", "kms_previous_key_file", "gateway_state_dir"):
        if not isinstance(value, str) or not value.strip():
            return None, f"{where} must be a non-empty path"
        return Path(value.strip()).expanduser(), None
    if key in _WHOLE_NUMBERS:
        return _check_whole(key, value, where, from_env=from_env)
    if key in _TEXTS:
        return _check_text(key, value, where)
    if key in ("pgbouncer", "webhooks_allow_private"):
        return _check_flag(value, where, from_env=from_env)
    if key == "roles":
        if not isinstance(value, str | list | tuple):
            return None, f"{where} must be a list of role names or a comma-separated string"
        try:
            return parse_roles(value), None
        except ValueError as exc:
            return None, f"{where}: {exc}"
    raise AssertionError(f"unhandled key {key}")  # every key of KEYS is handled above


def _check_database_url(value: Any, where: str) -> tuple[str | None, str | None]:
    if not isinstance(value, str):
        return None, f"{where} must be a string"
    url = value.strip()
    if not url.startswith(_URL_SCHEMES):
        # The URL may hold a password: say what is wrong without repeating it.
        return None, f"{where} must be a URL starting with postgresql://"
    return url, None


_WHOLE_NUMBERS: Mapping[str, tuple[int, int, int | None, str]] = {
    "port": (1, 65535, None, "a port number"),
    "gateway_port": (1, 65535, None, "a port number"),
    "internal_port": (1, 65535, None, "a port number"),
    "metrics_port": (1, 65535, None, "a port number"),
    "max_queued": (0, _MAX_QUEUED, 7, "a whole number of requests"),
    "tunnel_streams_per_tenant": (1, 100_000, 12, "a whole number"),
    "tunnel_bytes_per_second": (1024, 10 * 1024**3, 12, "a whole number"),
}
"""The keys whose values are whole numbers: the lowest and highest allowed, the most digits read from the
environment (``None``: any number of them), and what the problem calls such a value."""


def _check_whole(key: str, value: Any, where: str, *, from_env: bool) -> tuple[int | None, str | None]:
    low, high, digits, what = _WHOLE_NUMBERS[key]
    number: Any = value
    if from_env:  # ASCII digits only: int() would also read full-width or Arabic-Indic ones
        text = value.strip()
        readable = text.isascii() and text.isdigit() and (digits is None or len(text) <= digits)
        number = int(text) if readable else None
    if isinstance(number, bool) or not isinstance(number, int) or not low <= number <= high:
        return None, f"{where} must be {what} from {low} to {high}, not {value!r}"
    return number, None


_TEXTS = frozenset(
    {
        "trust_domain",
        "gateway_address",
        "tunnel_gateway",
        "internal_address",
        "host",
        "gateway_host",
        "internal_host",
        "metrics_host",
        "instance",
        "schema",
        "database_role_prefix",
    }
)
"""The keys whose values are non-empty strings (some of a given form)."""


def _check_text(key: str, value: Any, where: str) -> tuple[str | None, str | None]:
    if not isinstance(value, str) or not value.strip():
        return None, f"{where} must be a non-empty string"
    text = value.strip()
    if key == "trust_domain" and not _TRUST_DOMAIN.fullmatch(text):
        return None, f"{where} {text!r} must be a lower-case DNS name like compute.example.com"
    if key in ("gateway_address", "tunnel_gateway") and not _ADDRESS.fullmatch(text):
        return None, f"{where} {text!r} must be host:port"
    if key == "internal_address" and not all(_ADDRESS.fullmatch(a.strip()) for a in text.split(",")):
        return None, f"{where} {text!r} must be host:port, or several separated by commas"
    if key == "database_role_prefix" and (not _ROLE_PREFIX.fullmatch(text) or text.startswith("pg_")):
        return None, (
            f"{where} {text!r} must be a lower-case identifier (a-z, 0-9, _) of at most 50 characters,"
            " not starting with pg_"
        )
    if key == "schema" and (not _SCHEMA.fullmatch(text) or text.startswith("pg_")):
        return None, (
            f"{where} {text!r} must be a lower-case identifier (a-z, 0-9, _) of at most 63 characters,"
            " not starting with pg_"
        )
    return text, None


def _check_flag(value: Any, where: str, *, from_env: bool) -> tuple[bool | None, str | None]:
    if from_env:
        lowered = value.strip().lower()
        if lowered in _TRUE | _FALSE:
            return lowered in _TRUE, None
        return None, f"{where} must be true or false, not {value!r}"
    if not isinstance(value, bool):
        return None, f"{where} must be true or false, not {value!r}"
    return value, None


def _check_seconds(value: Any, where: str, *, from_env: bool) -> tuple[float | None, str | None]:
    """A lease TTL in seconds within ``_LEASE_TTL_SECONDS_RANGE``: an integer or a decimal number."""
    seconds: Any = value
    if from_env:
        try:
            seconds = float(value.strip())
        except ValueError:
            seconds = None
    low, high = _LEASE_TTL_SECONDS_RANGE
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not low <= seconds <= high
    ):
        return None, f"{where} must be a number of seconds from {low} to {high}, not {value!r}"
    return float(seconds), None


def _check_iam_url(url: str, where: str) -> tuple[str | None, str | None]:
    """An ``http(s)://host[:port][/path]`` URL; it may not carry a user or password (the credential goes apart)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return None, f"{where} must be an http:// or https:// URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None, f"{where} must be an http:// or https:// URL"
    if parts.username is not None or parts.password is not None:
        # It may hold a password: say what is wrong without repeating it.
        return None, f"{where} must not hold a user or password; the credential goes in iam_credential"
    if parts.query or parts.fragment:
        return None, f"{where} must not have a query or a fragment, not {url!r}"
    return url.rstrip("/"), None


def _check_pairs(given: set[str], problems: list[str]) -> None:
    """Keys that only make sense together, by the keys some source gave (well-formed or not)."""
    if ("iam_url" in given) != ("iam_credential" in given):
        present, missing = ("iam_url", "iam_credential") if "iam_url" in given else ("iam_credential", "iam_url")
        problems.append(
            f"{present} is set but {missing} is not: a central IAM needs both iam_url and iam_credential "
            f"({IAM_URL_ENV}, {IAM_CREDENTIAL_ENV}), or neither for the embedded IAM"
        )
    if ("trust_domain" in given) != ("gateway_address" in given):
        present, missing = (
            ("trust_domain", "gateway_address") if "trust_domain" in given else ("gateway_address", "trust_domain")
        )
        problems.append(f"{present} is set but {missing} is not: joining nodes needs both (the join command pins both)")


def _merge(values: dict[str, Any], problems: list[str], key: str, value: Any, problem: str | None) -> None:
    if problem is None:
        values[key] = value
    else:
        problems.append(problem)


def _read_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return {}, [f"{path}: cannot be read ({exc.strerror or type(exc).__name__})"]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return {}, [f"{path}: not valid TOML ({exc})"]
    return data, []


def load_config(
    path: Path | str | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Read the configuration: defaults < the TOML file < ``BETTERCOMPUTE_*`` variables < ``overrides``.

    Args:
        path: The TOML file; ``None`` means ``$BETTERCOMPUTE_CONFIG`` if set, else no file.
        environ: The environment (``os.environ`` when ``None``); empty variables count as unset.
        overrides: Values from command-line flags, by key; ``None`` values are ignored.

    Raises:
        ConfigError: listing every problem: an unknown key, a wrong type, a bad port, role, schema name or lease
            TTL, or ``iam_url`` without ``iam_credential`` (or the reverse).
    """
    env = os.environ if environ is None else environ
    problems: list[str] = []
    values: dict[str, Any] = {}
    given: set[str] = set()  # keys some source set, well-formed or not
    if path is None and env.get(CONFIG_ENV, "").strip():
        path = env[CONFIG_ENV].strip()
    if path is not None:
        file = Path(path)
        data, problems = _read_file(file)
        for key in sorted(set(data) - set(KEYS)):
            problems.append(f"{file}: unknown key {key!r}; the keys are {', '.join(KEYS)}")
        for key in KEYS:
            if key in data:
                given.add(key)
                _merge(values, problems, key, *_check(key, data[key], f"{file}: {key}"))
    for key in KEYS:
        name = ENV_PREFIX + key.upper()
        raw = env.get(name, "")
        if raw.strip():
            given.add(key)
            _merge(values, problems, key, *_check(key, raw, name, from_env=True))
    for key, raw_value in (overrides or {}).items():
        if key not in KEYS:
            raise TypeError(f"load_config() got an unknown override {key!r}")
        if raw_value is not None:
            given.add(key)
            _merge(values, problems, key, *_check(key, raw_value, f"--{key.replace('_', '-')}"))
    _check_pairs(given, problems)
    if problems:
        raise ConfigError(problems)
    return attrs.evolve(Config(), **values)
