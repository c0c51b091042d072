"""A Redfish client for one machine's BMC: what the machine is, its power, and the device it boots from next.

The client speaks plain Redfish over httpx rather than through sushy: the requests it needs are a handful of GETs, one
POST and one PATCH, and httpx is already a core dependency, so the metal module adds nothing to the dependency list.

Trust in the BMC is explicit (``BmcTls``): either a CA that signed the BMC's certificate (chain and host name are
checked) or the SHA-256 of the certificate itself, which is how most BMCs' self-signed certificates are trusted. With
a pin, the check runs inside the TLS handshake of every connection, before a byte of HTTP (and so before the
``Authorization`` header) is written: see ``_PinnedSSLObject``.

Everything the BMC sends is treated as hostile input: bodies are capped at ``MAX_BODY_BYTES`` and must be JSON no
deeper than ``MAX_JSON_DEPTH``; links are followed only as paths under ``/redfish/v1`` on the same origin; redirects
are not followed; collections are read up to ``MAX_MEMBERS`` members. Every failure is a ``RedfishError`` whose
``reason`` a caller can act on, and whose message never holds the password, the ``Authorization`` header or more than
a short, cleaned excerpt of what the BMC said.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import ssl
import string
import urllib.parse
from collections.abc import Mapping
from types import TracebackType
from typing import Any, ClassVar, Final, Literal, Self

import anyio
import attrs
import httpx
from cryptography import x509

from bettercompute.errors import InvalidInputError

__all__ = [
    "BMC_AUTH_FAILED",
    "BMC_BAD_RESPONSE",
    "BMC_ERROR",
    "BMC_NOT_FOUND",
    "BMC_TLS_FAILED",
    "BMC_UNREACHABLE",
    "BmcBoot",
    "BmcCredentials",
    "BmcDisk",
    "BmcInventory",
    "BmcNic",
    "BmcTls",
    "PowerAction",
    "RedfishClient",
    "RedfishError",
    "certificate_pin",
    "parse_bmc_url",
]

logger = logging.getLogger(__name__)

BMC_UNREACHABLE: Final = "BMC_UNREACHABLE"
BMC_AUTH_FAILED: Final = "BMC_AUTH_FAILED"
BMC_TLS_FAILED: Final = "BMC_TLS_FAILED"
BMC_NOT_FOUND: Final = "BMC_NOT_FOUND"
BMC_BAD_RESPONSE: Final = "BMC_BAD_RESPONSE"
BMC_ERROR: Final = "BMC_ERROR"

MAX_BODY_BYTES: Final = 1024 * 1024
MAX_JSON_DEPTH: Final = 32
MAX_MEMBERS: Final = 128
MAX_URL_CHARS: Final = 2048
ROOT: Final = "/redfish/v1"

PowerAction = Literal["on", "off", "shutdown", "reset", "cycle"]
_RESET_TYPE: Final[Mapping[str, str]] = {
    "on": "On",
    "off": "ForceOff",
    "shutdown": "GracefulShutdown",
    "reset": "ForceRestart",
}
# The power state each action leaves behind when it has landed; an action already there is not sent again (many BMCs
# answer "On" on a machine that is on with an error).
_SETTLED: Final[Mapping[str, str]] = {"on": "On", "off": "Off", "shutdown": "Off"}
_BOOT_TARGET = re.compile(r"[A-Za-z][A-Za-z0-9]{0,31}")
_MAC = re.compile(r"[0-9a-f]{2}([:-]?)[0-9a-f]{2}(\1[0-9a-f]{2}){4}")
_PIN = re.compile(r"[0-9a-f]{64}")
_DNS_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
# RFC 3986 path characters; a link from the BMC with anything else (a space, a backslash, a quote) is refused.
_PATH_CHARS = frozenset(string.ascii_letters + string.digits + "-._~!$&'()*+,;=:@%/")


class RedfishError(Exception):
    """A BMC could not be reached, refused us, or answered something this client cannot use.

    It does not cross the API by itself: the metal module's methods and workflows turn it into their own outcome (a
    failed step, an ``UNAVAILABLE`` or ``FAILED_PRECONDITION`` error) and may carry ``reason`` along in details.

    Args:
        reason: One of ``BMC_UNREACHABLE`` (no connection, DNS, timeout), ``BMC_AUTH_FAILED`` (401 or 403),
            ``BMC_TLS_FAILED`` (certificate not trusted, pin mismatch, handshake failure), ``BMC_NOT_FOUND`` (no
            system, or a resource the BMC does not have), ``BMC_BAD_RESPONSE`` (not JSON, the wrong shape, too large
            or too deep) and ``BMC_ERROR`` (any other error status; ``status`` holds it).
        message: One sentence for a person, with no secret in it.
        retryable: Whether the same call may succeed later unchanged (unreachable, a 5xx or 429).
        status: The HTTP status, when the BMC answered with one.
    """

    def __init__(self, reason: str, message: str, *, retryable: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.retryable = retryable
        self.status = status

    def __repr__(self) -> str:
        return f"RedfishError({self.reason!r}, {self.message!r}, retryable={self.retryable}, status={self.status})"


def _invalid(field: str, message: str) -> InvalidInputError:
    return InvalidInputError(message, details={"field": field})


def _printable_ascii(text: str) -> bool:
    return all(0x21 <= ord(char) <= 0x7E for char in text)


def parse_bmc_url(url: object, *, allow_plain_http: bool = False, field: str = "url") -> str:
    """The BMC's origin (``https://host[:port]``) from what an operator typed, or ``INVALID_INPUT``.

    Accepted: ``https`` (``http`` only with ``allow_plain_http``, which tests use), a DNS name, an IPv4 address or a
    bracketed IPv6 address, an optional port, and an optional path of ``/`` or ``/redfish/v1``. Refused: user
    information (credentials travel in ``BmcCredentials``, never in a URL that gets logged), a query or fragment, a
    zone id, and any character outside printable ASCII (NUL, whitespace, Unicode look-alikes: an international name
    must be given in its ``xn--`` form).

    Args:
        url: The URL as given.
        allow_plain_http: Accept ``http://`` too.
        field: The input field named in the error's ``details``.

    Raises:
        InvalidInputError: The URL is not acceptable; ``details["field"]`` is ``field``.
    """
    if not isinstance(url, str) or not url:
        raise _invalid(field, "The BMC URL must be a non-empty string.")
    if len(url) > MAX_URL_CHARS:
        raise _invalid(field, f"The BMC URL is longer than {MAX_URL_CHARS} characters.")
    if not _printable_ascii(url):
        raise _invalid(
            field,
            "The BMC URL may hold only printable ASCII: no spaces, control characters or non-ASCII letters "
            "(write an international host name in its xn-- form).",
        )
    if "@" in url.partition("://")[2].partition("/")[0]:
        raise _invalid(field, "The BMC URL may not carry a user name or password; give them as credentials.")
    if "?" in url or "#" in url:
        raise _invalid(field, "The BMC URL may not have a query or a fragment.")
    if "\\" in url:
        raise _invalid(field, "The BMC URL may not contain a backslash.")
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an unclosed or misused bracket, which urlsplit itself refuses
        raise _invalid(field, "The BMC URL is not a valid URL.") from None
    scheme = parts.scheme.lower()
    if scheme == "http" and not allow_plain_http:
        raise _invalid(field, "The BMC URL must use https: credentials are never sent in the clear.")
    if scheme not in ("https", "http"):
        raise _invalid(field, "The BMC URL must start with https://.")
    if parts.path.rstrip("/") not in ("", ROOT):
        raise _invalid(field, f"The BMC URL may have no path other than {ROOT}.")
    host, port = _split_netloc(parts.netloc, field)
    return f"{scheme}://{host}" + (f":{port}" if port is not None else "")


def _split_netloc(netloc: str, field: str) -> tuple[str, int | None]:
    port_text: str | None = None
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise _invalid(field, "The BMC URL's IPv6 address has no closing bracket.")
        host_text, rest = netloc[1:end], netloc[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise _invalid(field, "The BMC URL has something after its IPv6 address that is not a port.")
            port_text = rest[1:]
        if "%" in host_text:
            raise _invalid(field, "The BMC URL may not use an IPv6 zone id.")
        try:
            host = f"[{ipaddress.IPv6Address(host_text).compressed}]"
        except ValueError:
            raise _invalid(field, "The BMC URL's bracketed host is not an IPv6 address.") from None
    else:
        host_text, colon, port_part = netloc.partition(":")
        if colon:
            port_text = port_part
        host = host_text.lower()
        if not host:
            raise _invalid(field, "The BMC URL has no host.")
        if not _valid_host(host):
            raise _invalid(field, "The BMC URL's host is neither an IPv4 address nor a valid DNS name.")
    port: int | None = None
    if port_text is not None:
        # int() alone would take "+80", " 80" or "0080"-style oddities; only plain digits are a port.
        if not port_text.isdigit() or not 1 <= len(port_text) <= 5 or not 1 <= int(port_text) <= 65535:
            raise _invalid(field, "The BMC URL's port must be a number from 1 to 65535.")
        port = int(port_text)
    return host, port


def _valid_host(host: str) -> bool:
    if all(char.isdigit() or char == "." for char in host):
        # Only digits and dots: it must be a dotted-quad IPv4 address (not "10.1", nor an octal-looking "010.0.0.1").
        try:
            return str(ipaddress.IPv4Address(host)) == host
        except ValueError:
            return False
    name = host[:-1] if host.endswith(".") else host
    return 0 < len(name) <= 253 and all(_DNS_LABEL.fullmatch(label) for label in name.split("."))


def certificate_pin(certificate: str | bytes) -> str:
    """The pin of a certificate (PEM text, or DER bytes): the SHA-256 of its DER, as 64 lowercase hex digits."""
    der = ssl.PEM_cert_to_DER_cert(certificate) if isinstance(certificate, str) else certificate
    return hashlib.sha256(der).hexdigest()


def _normalize_pin(value: str | None) -> str | None:
    if value is None:
        return None
    return value.strip().replace(":", "").lower()


@attrs.frozen
class BmcTls:
    """How the BMC's certificate is trusted: exactly one of ``ca_pem`` and ``pin_sha256``.

    Args:
        ca_pem: A CA (PEM, one or more certificates) the BMC's chain must verify against; the host name in the URL
            must match the certificate.
        pin_sha256: The SHA-256 of the BMC's own certificate (DER), as 64 hex digits (colons allowed). The chain and
            host name are not checked, but no request is sent to a BMC presenting any other certificate.

    Raises:
        InvalidInputError: Neither or both are given, the pin is not 64 hex digits, or the CA is not PEM.
    """

    ca_pem: str | None = None
    pin_sha256: str | None = attrs.field(default=None, converter=_normalize_pin)

    def __attrs_post_init__(self) -> None:
        if (self.ca_pem is None) == (self.pin_sha256 is None):
            raise _invalid("tls", "Give exactly one of a CA certificate and a certificate pin for the BMC.")
        if self.pin_sha256 is not None and not _PIN.fullmatch(self.pin_sha256):
            raise _invalid("tls.pin_sha256", "The certificate pin must be a SHA-256 as 64 hex digits.")
        if self.ca_pem is not None:
            try:
                x509.load_pem_x509_certificates(self.ca_pem.encode())
            except ValueError:
                raise _invalid("tls.ca_pem", "The BMC's CA is not a PEM certificate.") from None

    def ssl_context(self) -> ssl.SSLContext:
        """The client context for this trust: a verifying one for a CA, a pinning one for a pin (TLS 1.2 or later)."""
        if self.ca_pem is not None:
            context = ssl.create_default_context(cadata=self.ca_pem)
        else:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            # The class is made per pin: wrap_bio() builds the connection's TLS object from it, so no connection of
            # this context can finish its handshake with another certificate.
            context.sslobject_class = type("PinnedSSLObject", (_PinnedSSLObject,), {"pin_sha256": self.pin_sha256})
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context


class _PinMismatchError(ssl.SSLCertVerificationError):
    """The BMC presented a certificate other than the pinned one (raised from inside the handshake)."""

    def __init__(self, presented: str) -> None:
        super().__init__(f"the certificate's SHA-256 is {presented or 'absent'}, not the pinned one")
        self.presented = presented
        self.verify_message = "certificate does not match the pin"


class _PinnedSSLObject(ssl.SSLObject):
    """A TLS connection that fails its own handshake unless the server's certificate has the pinned SHA-256.

    Why here: httpx (through httpcore and anyio) builds every connection's TLS object with ``SSLContext.wrap_bio``,
    which returns an instance of the context's ``sslobject_class`` (documented, settable per context), and writes a
    request only after ``do_handshake`` has returned. Failing ``do_handshake`` therefore stops a connection with the
    wrong certificate before its first request, whichever connection of the pool it is: a fresh one after a BMC
    restart is checked as the first one was. Checking responses instead would be too late, as the request holding
    the ``Authorization`` header would already be gone. ``RedfishClient`` also confirms, on a first request without
    credentials, that the connection really went through this class (``_check_peer``), so a transport that stopped
    honouring ``sslobject_class`` would be noticed before any credential is sent.
    """

    pin_sha256: ClassVar[str] = ""

    def do_handshake(self) -> None:
        super().do_handshake()
        der = self.getpeercert(binary_form=True)
        presented = hashlib.sha256(der).hexdigest() if der else ""
        if not self.pin_sha256 or not hmac.compare_digest(presented, self.pin_sha256):
            raise _PinMismatchError(presented)


@attrs.frozen(repr=False)
class BmcCredentials:
    """A BMC account, sent as HTTP basic auth. ``repr()`` shows the user name only.

    Raises:
        InvalidInputError: The user name is empty, has a colon or a control character, or the password is empty or
            has a control character (the message never holds either value).
    """

    username: str
    password: str

    def __attrs_post_init__(self) -> None:
        if not self.username or len(self.username) > 256 or ":" in self.username or _has_control(self.username):
            raise _invalid(
                "credentials.username",
                "The BMC user name must be 1 to 256 characters with no colon or control character.",
            )
        if not self.password or len(self.password) > 256 or _has_control(self.password):
            raise _invalid(
                "credentials.password", "The BMC password must be 1 to 256 characters with no control character."
            )

    def __repr__(self) -> str:
        return f"BmcCredentials(username={self.username!r}, password='***')"

    __str__ = __repr__


def _has_control(text: str) -> bool:
    return any(ord(char) < 0x20 or ord(char) == 0x7F for char in text)


def _to_json(instance: Any) -> dict[str, Any]:
    result: dict[str, Any] = attrs.asdict(instance, value_serializer=_list_tuples)
    return result


def _list_tuples(instance: Any, field: Any, value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@attrs.frozen
class BmcNic:
    """A network interface as the BMC lists it; ``mac`` is lowercase with colons, or None when it reports none."""

    id: str
    mac: str | None
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values."""
        return _to_json(self)


@attrs.frozen
class BmcDisk:
    """A drive (``Storage``'s ``Drives``) or a device of ``SimpleStorage``; ``size_bytes`` None when not reported."""

    id: str
    name: str | None
    size_bytes: int | None
    media_type: str | None = None
    protocol: str | None = None
    model: str | None = None
    serial_number: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values."""
        return _to_json(self)


@attrs.frozen
class BmcBoot:
    """The system's boot settings: the override in place, its frequency, the firmware mode and what may be chosen."""

    override_target: str | None
    override_enabled: str | None
    mode: str | None
    allowed_targets: tuple[str, ...] = ()
    boot_order: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values."""
        return _to_json(self)


@attrs.frozen
class BmcInventory:
    """What the BMC says about its (first) computer system. Anything it does not report is None or empty.

    ``system_path`` is the Redfish path of the system (``/redfish/v1/Systems/<id>``); ``cpu_count`` the number of
    processors (sockets), ``cpu_cores`` their cores summed when the ``Processors`` collection reports them;
    ``memory_gib`` is ``MemorySummary.TotalSystemMemoryGiB``.
    """

    system_path: str
    uuid: str | None
    name: str | None
    serial_number: str | None
    manufacturer: str | None
    model: str | None
    power_state: str | None
    cpu_count: int | None
    cpu_cores: int | None
    cpu_model: str | None
    memory_gib: float | None
    nics: tuple[BmcNic, ...]
    disks: tuple[BmcDisk, ...]
    boot: BmcBoot

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (tuples become lists)."""
        return _to_json(self)


def _bad(message: str) -> RedfishError:
    return RedfishError(BMC_BAD_RESPONSE, message)


def _excerpt(text: str, secrets: tuple[str, ...]) -> str:
    """At most 160 printable characters of ``text``, with every secret in it replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    cleaned = "".join(char if char.isprintable() and char.isascii() else " " for char in text)
    cleaned = " ".join(cleaned.split())
    return cleaned[:157] + "..." if len(cleaned) > 160 else cleaned


def _depth_within(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _decode(body: bytes, what: str) -> Any:
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except RecursionError:
        raise _bad(f"The BMC's answer to {what} is JSON nested too deeply.") from None
    except ValueError:
        raise _bad(f"The BMC's answer to {what} is not JSON.") from None
    if not _depth_within(value, MAX_JSON_DEPTH):
        raise _bad(f"The BMC's answer to {what} is JSON nested deeper than {MAX_JSON_DEPTH} levels.")
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"The BMC's {what} is not a JSON object.")
    return value


def _optional_object(resource: Mapping[str, Any], key: str, what: str) -> dict[str, Any]:
    value = resource.get(key)
    if value is None:
        return {}
    return _object(value, f"{what}'s {key}")


def _text(resource: Mapping[str, Any], key: str, what: str) -> str | None:
    value = resource.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(f"The BMC's {what} has a {key} that is not a string.")
    value = value.strip()
    return value[:256] if value else None


def _integer(resource: Mapping[str, Any], key: str, what: str) -> int | None:
    value = resource.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _bad(f"The BMC's {what} has a {key} that is not a non-negative integer.")
    return value


def _number(resource: Mapping[str, Any], key: str, what: str) -> float | None:
    value = resource.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _bad(f"The BMC's {what} has a {key} that is not a non-negative number.")
    return float(value)


def _texts(resource: Mapping[str, Any], key: str, what: str) -> tuple[str, ...]:
    value = resource.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _bad(f"The BMC's {what} has a {key} that is not a list of strings.")
    return tuple(item[:64] for item in value[:MAX_MEMBERS])


def _mac(value: str | None) -> str | None:
    if not value:
        return None
    compact = value.strip().lower()
    if not _MAC.fullmatch(compact):
        return None  # A BMC's placeholder ("", "N/A", all zeros in odd forms): the NIC is listed without a MAC.
    digits = re.sub(r"[^0-9a-f]", "", compact)
    mac = ":".join(digits[index : index + 2] for index in range(0, 12, 2))
    return None if mac == "00:00:00:00:00:00" else mac


def _safe_path(value: Any, what: str) -> str:
    """A link the BMC gave, as a path under ``/redfish/v1`` of the same origin (its fragment dropped)."""
    if not isinstance(value, str):
        raise _bad(f"The BMC's link for {what} is not a string.")
    path = value.partition("#")[0]
    segments = path.split("/")
    if (
        not path.startswith(ROOT)
        or path[len(ROOT) : len(ROOT) + 1] not in ("", "/")
        or len(path) > 512
        or not set(path) <= _PATH_CHARS
        or "//" in path
        or any(segment in (".", "..") for segment in segments)
    ):
        raise _bad(f"The BMC's link for {what} is not a path under {ROOT}.")
    return path.rstrip("/") or ROOT


def _link(resource: Mapping[str, Any], key: str, what: str) -> str | None:
    value = resource.get(key)
    if value is None:
        return None
    return _safe_path(_object(value, f"{what}'s {key} link").get("@odata.id"), f"{what}'s {key}")


def _members(collection: Mapping[str, Any], what: str) -> list[str]:
    members = collection.get("Members")
    if members is None:
        return []
    if not isinstance(members, list):
        raise _bad(f"The BMC's {what} collection has Members that is not a list.")
    return [_safe_path(_object(member, f"{what} member").get("@odata.id"), what) for member in members[:MAX_MEMBERS]]


class RedfishClient:
    """A client for one BMC; use it as an async context manager (``async with RedfishClient(...) as bmc``).

    Each request must complete, body included, within ``timeout`` seconds. The first request made (lazily, by the
    first method called) is a GET of the service root without credentials: it finds the systems collection and, with
    a pinned certificate, confirms the pin was checked on that connection before credentials go anywhere.

    Args:
        url: The BMC's URL; see ``parse_bmc_url``.
        credentials: The BMC account.
        tls: How the BMC's certificate is trusted; required for ``https`` (ignored for ``http``).
        timeout: Seconds each request may take, connection included.
        allow_plain_http: Accept an ``http://`` URL (tests only: credentials would cross the network in the clear).

    Raises:
        InvalidInputError: The URL, the credentials or the trust are not acceptable.
    """

    def __init__(
        self,
        url: str,
        credentials: BmcCredentials,
        tls: BmcTls | None,
        timeout: float = 10.0,
        *,
        allow_plain_http: bool = False,
    ) -> None:
        self.origin = parse_bmc_url(url, allow_plain_http=allow_plain_http)
        if not isinstance(credentials, BmcCredentials):
            raise _invalid("credentials", "The BMC's credentials must be BmcCredentials.")
        self._https = self.origin.startswith("https://")
        if self._https and not isinstance(tls, BmcTls):
            raise _invalid("tls", "An https BMC needs a CA or a certificate pin to trust.")
        if not 0 < timeout <= 300:
            raise _invalid("timeout", "The BMC timeout must be more than 0 and at most 300 seconds.")
        self._tls = tls if self._https else None
        self._timeout = float(timeout)
        self._auth = httpx.BasicAuth(credentials.username, credentials.password)
        # What must never appear in a message: the password, and the header value that carries it.
        token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
        self._secrets = (credentials.password, token)
        self._client: httpx.AsyncClient | None = None
        self._systems_path: str | None = None
        self._system_path: str | None = None

    async def __aenter__(self) -> Self:
        self._client = httpx.AsyncClient(
            verify=self._tls.ssl_context() if self._tls is not None else True,
            timeout=httpx.Timeout(self._timeout),
            follow_redirects=False,
            trust_env=False,  # no proxy, .netrc or SSL_CERT_FILE from the environment decides where credentials go
            headers={"Accept": "application/json", "Accept-Encoding": "identity", "OData-Version": "4.0"},
            limits=httpx.Limits(max_connections=4, max_keepalive_connections=2),
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def __repr__(self) -> str:
        return f"RedfishClient({self.origin!r})"

    # -- the operations ------------------------------------------------------------------------------------------

    async def inspect(self) -> BmcInventory:
        """The first computer system's identity, power state, processors, memory, NICs, disks and boot settings.

        Raises:
            RedfishError: With the reasons listed on the class; ``BMC_NOT_FOUND`` when the BMC lists no system.
        """
        path = await self._system()
        system = _object(await self._get(path), "system")
        what = "system"
        processors = _optional_object(system, "ProcessorSummary", what)
        memory = _optional_object(system, "MemorySummary", what)
        cpu_count = _integer(processors, "Count", "ProcessorSummary")
        cpu_model = _text(processors, "Model", "ProcessorSummary")
        cpu_cores: int | None = None
        processors_path = _link(system, "Processors", what)
        if processors_path is not None:
            listed = await self._processors(processors_path)
            if listed:
                cpu_count = len(listed) if cpu_count is None else cpu_count
                cpu_model = cpu_model or next((model for model, _ in listed if model), None)
                cores = [count for _, count in listed if count is not None]
                cpu_cores = sum(cores) if cores else None
        nics_path = _link(system, "EthernetInterfaces", what)
        nics = await self._nics(nics_path) if nics_path is not None else ()
        disks: tuple[BmcDisk, ...] = ()
        storage_path = _link(system, "Storage", what)
        if storage_path is not None:
            disks = await self._storage_drives(storage_path)
        simple_path = _link(system, "SimpleStorage", what)
        if not disks and simple_path is not None:
            disks = await self._simple_storage(simple_path)
        boot = _optional_object(system, "Boot", what)
        return BmcInventory(
            system_path=path,
            uuid=_text(system, "UUID", what),
            name=_text(system, "Name", what),
            serial_number=_text(system, "SerialNumber", what),
            manufacturer=_text(system, "Manufacturer", what),
            model=_text(system, "Model", what),
            power_state=_text(system, "PowerState", what),
            cpu_count=cpu_count,
            cpu_cores=cpu_cores,
            cpu_model=cpu_model,
            memory_gib=_number(memory, "TotalSystemMemoryGiB", "MemorySummary"),
            nics=nics,
            disks=disks,
            boot=BmcBoot(
                override_target=_text(boot, "BootSourceOverrideTarget", "Boot"),
                override_enabled=_text(boot, "BootSourceOverrideEnabled", "Boot"),
                mode=_text(boot, "BootSourceOverrideMode", "Boot"),
                allowed_targets=_texts(boot, "BootSourceOverrideTarget@Redfish.AllowableValues", "Boot"),
                boot_order=_texts(boot, "BootOrder", "Boot"),
            ),
        )

    async def power_state(self) -> str:
        """The system's ``PowerState`` (``On``, ``Off``, ``PoweringOn``, ``PoweringOff``, ...)."""
        system = _object(await self._get(await self._system()), "system")
        state = _text(system, "PowerState", "system")
        if state is None:
            raise _bad("The BMC's system reports no PowerState.")
        return state

    async def power(self, action: PowerAction, *, settle_timeout: float = 60.0, poll_interval: float = 1.0) -> None:
        """Ask the BMC to change the system's power; this returns once the BMC accepted, not once it has landed.

        ``on`` (``On``), ``off`` (``ForceOff``) and ``shutdown`` (``GracefulShutdown``) send nothing when the system is
        already in that state. ``reset`` is ``ForceRestart``. ``cycle`` uses the BMC's ``PowerCycle`` when it offers
        one; otherwise a system that is off is turned on, and one that is on is forced off, waited for (up to
        ``settle_timeout`` seconds, reading every ``poll_interval``) and turned on.

        Raises:
            InvalidInputError: ``action`` is not one of the five.
            RedfishError: The BMC refused or could not be reached; ``BMC_UNREACHABLE`` (retryable) when a cycle's
                power-off did not land in time.
        """
        if action not in ("on", "off", "shutdown", "reset", "cycle"):
            raise _invalid("action", "The power action must be one of on, off, shutdown, reset and cycle.")
        path = await self._system()
        system = _object(await self._get(path), "system")
        state = _text(system, "PowerState", "system")
        target, allowed = self._reset_action(system, path)
        if action == "cycle":
            if "PowerCycle" in allowed:
                await self._post(target, {"ResetType": "PowerCycle"})
                return
            if state == "On":
                await self._post(target, {"ResetType": "ForceOff"})
                await self._wait_for_power("Off", settle_timeout, poll_interval)
            await self._post(target, {"ResetType": "On"})
            return
        if _SETTLED.get(action) == state:
            logger.debug("BMC %s: power %s skipped, the system is already %s", self.origin, action, state)
            return
        await self._post(target, {"ResetType": _RESET_TYPE[action]})

    async def set_boot_once(self, target: str = "Pxe") -> None:
        """Boot the system once from ``target`` (a Redfish ``BootSourceOverrideTarget``: ``Pxe``, ``Hdd``, ``Cd``...).

        Raises:
            InvalidInputError: ``target`` is not a plain Redfish name.
            RedfishError: The BMC refused the change or could not be reached.
        """
        if not isinstance(target, str) or not _BOOT_TARGET.fullmatch(target):
            raise _invalid("target", "The boot target must be a Redfish boot source name such as Pxe.")
        path = await self._system()
        await self._send(
            "PATCH", path, {"Boot": {"BootSourceOverrideTarget": target, "BootSourceOverrideEnabled": "Once"}}
        )

    # -- the steps -----------------------------------------------------------------------------------------------

    async def _system(self) -> str:
        if self._system_path is not None:
            return self._system_path
        systems_path = await self._service_root()
        members = _members(_object(await self._get(systems_path), "systems collection"), "systems")
        if not members:
            raise RedfishError(BMC_NOT_FOUND, "The BMC lists no computer system.")
        self._system_path = members[0]
        return self._system_path

    def _reset_action(self, system: Mapping[str, Any], path: str) -> tuple[str, tuple[str, ...]]:
        actions = _optional_object(system, "Actions", "system")
        reset = _optional_object(actions, "#ComputerSystem.Reset", "system's Actions")
        target_value = reset.get("target")
        target = (
            _safe_path(target_value, "ComputerSystem.Reset")
            if target_value is not None
            else f"{path}/Actions/ComputerSystem.Reset"
        )
        return target, _texts(reset, "ResetType@Redfish.AllowableValues", "ComputerSystem.Reset")

    async def _wait_for_power(self, wanted: str, settle_timeout: float, poll_interval: float) -> None:
        with anyio.move_on_after(settle_timeout):
            while True:
                if await self.power_state() == wanted:
                    return
                await anyio.sleep(poll_interval)
        raise RedfishError(
            BMC_UNREACHABLE, f"The system's power did not become {wanted} within {settle_timeout:g} s.", retryable=True
        )

    async def _processors(self, path: str) -> list[tuple[str | None, int | None]]:
        collection = await self._get_optional(path)
        if collection is None:
            return []
        found: list[tuple[str | None, int | None]] = []
        for member in _members(_object(collection, "processors collection"), "processors"):
            processor = _object(await self._get(member), "processor")
            kind = _text(processor, "ProcessorType", "processor")
            if kind not in (None, "CPU"):
                continue  # GPUs, FPGAs and accelerators are the node agent's to report, not the BMC's CPU count.
            found.append((_text(processor, "Model", "processor"), _integer(processor, "TotalCores", "processor")))
        return found

    async def _nics(self, path: str) -> tuple[BmcNic, ...]:
        collection = await self._get_optional(path)
        if collection is None:
            return ()
        nics: list[BmcNic] = []
        for member in _members(_object(collection, "EthernetInterfaces collection"), "EthernetInterfaces"):
            nic = _object(await self._get(member), "EthernetInterface")
            mac = _mac(_text(nic, "MACAddress", "EthernetInterface")) or _mac(
                _text(nic, "PermanentMACAddress", "EthernetInterface")
            )
            nics.append(
                BmcNic(
                    id=_text(nic, "Id", "EthernetInterface") or member.rsplit("/", 1)[-1],
                    mac=mac,
                    name=_text(nic, "Name", "EthernetInterface"),
                )
            )
        return tuple(nics)

    async def _storage_drives(self, path: str) -> tuple[BmcDisk, ...]:
        collection = await self._get_optional(path)
        if collection is None:
            return ()
        disks: list[BmcDisk] = []
        for member in _members(_object(collection, "Storage collection"), "Storage"):
            storage = _object(await self._get(member), "Storage")
            links = storage.get("Drives") or []
            if not isinstance(links, list):
                raise _bad("The BMC's Storage has Drives that is not a list.")
            for link in links[:MAX_MEMBERS]:
                drive_path = _safe_path(_object(link, "Drives link").get("@odata.id"), "Drive")
                drive = _object(await self._get(drive_path), "Drive")
                disks.append(
                    BmcDisk(
                        id=_text(drive, "Id", "Drive") or drive_path.rsplit("/", 1)[-1],
                        name=_text(drive, "Name", "Drive"),
                        size_bytes=_integer(drive, "CapacityBytes", "Drive"),
                        media_type=_text(drive, "MediaType", "Drive"),
                        protocol=_text(drive, "Protocol", "Drive"),
                        model=_text(drive, "Model", "Drive"),
                        serial_number=_text(drive, "SerialNumber", "Drive"),
                    )
                )
        return tuple(disks)

    async def _simple_storage(self, path: str) -> tuple[BmcDisk, ...]:
        collection = await self._get_optional(path)
        if collection is None:
            return ()
        disks: list[BmcDisk] = []
        for member in _members(_object(collection, "SimpleStorage collection"), "SimpleStorage"):
            controller = _object(await self._get(member), "SimpleStorage")
            devices = controller.get("Devices") or []
            if not isinstance(devices, list):
                raise _bad("The BMC's SimpleStorage has Devices that is not a list.")
            controller_id = _text(controller, "Id", "SimpleStorage") or member.rsplit("/", 1)[-1]
            for index, device_value in enumerate(devices[:MAX_MEMBERS]):
                device = _object(device_value, "SimpleStorage device")
                status = _optional_object(device, "Status", "SimpleStorage device")
                if _text(status, "State", "SimpleStorage device Status") == "Absent":
                    continue
                disks.append(
                    BmcDisk(
                        id=f"{controller_id}/{index}",
                        name=_text(device, "Name", "SimpleStorage device"),
                        size_bytes=_integer(device, "CapacityBytes", "SimpleStorage device"),
                        model=_text(device, "Model", "SimpleStorage device"),
                    )
                )
        return tuple(disks)

    # -- the wire ------------------------------------------------------------------------------------------------

    async def _get(self, path: str) -> Any:
        return await self._send("GET", path, None)

    async def _get_optional(self, path: str) -> Any:
        """A resource the system links to but the BMC may not implement: None for 404 or 501."""
        try:
            return await self._get(path)
        except RedfishError as error:
            if error.reason == BMC_NOT_FOUND or error.status == 501:
                logger.debug("BMC %s: %s is not there (%s)", self.origin, path, error.status)
                return None
            raise

    async def _post(self, path: str, body: Mapping[str, Any]) -> None:
        await self._send("POST", path, body)

    async def _send(self, method: str, path: str, body: Mapping[str, Any] | None, *, credentials: bool = True) -> Any:
        """Send one request and return its JSON body (None when empty), or raise the matching ``RedfishError``."""
        client = self._client
        if client is None:
            raise RuntimeError("RedfishClient is used outside its 'async with' block")
        what = f"{method} {path}"
        url = httpx.URL(self.origin).copy_with(raw_path=path.encode("ascii"))
        if credentials and self._systems_path is None:
            await self._service_root()
        try:
            with anyio.fail_after(self._timeout):
                async with client.stream(method, url, json=body, auth=self._auth if credentials else None) as response:
                    self._check_peer(response)
                    status = response.status_code
                    raw = await self._read(response, what)
        except TimeoutError:
            raise RedfishError(
                BMC_UNREACHABLE, f"The BMC did not answer {what} within {self._timeout:g} s.", retryable=True
            ) from None
        except httpx.HTTPError as error:
            raise self._transport_error(error, what) from None
        logger.debug("BMC %s: %s -> %s", self.origin, what, status)
        if 200 <= status < 300:
            return _decode(raw, what) if raw.strip() else None
        raise self._status_error(status, raw, what)

    async def _service_root(self) -> str:
        """The systems collection's path, from the service root (fetched once).

        The service root needs no credentials, and it is always this client's first request: with a pin,
        ``_check_peer`` proves on it that connections go through the pinning handshake before any credential is sent.
        """
        if self._systems_path is None:
            root = _object(await self._send("GET", ROOT, None, credentials=False), "service root")
            self._systems_path = _link(root, "Systems", "service root") or f"{ROOT}/Systems"
        return self._systems_path

    def _check_peer(self, response: httpx.Response) -> None:
        if not self._https or self._tls is None or self._tls.pin_sha256 is None:
            return
        stream = response.extensions.get("network_stream")
        ssl_object = stream.get_extra_info("ssl_object") if stream is not None else None
        der = ssl_object.getpeercert(binary_form=True) if isinstance(ssl_object, ssl.SSLObject) else None
        if (
            not isinstance(ssl_object, _PinnedSSLObject)
            or der is None
            or not hmac.compare_digest(hashlib.sha256(der).hexdigest(), self._tls.pin_sha256)
        ):
            raise RedfishError(
                BMC_TLS_FAILED, "The connection to the BMC was not checked against the certificate pin; refusing it."
            )

    async def _read(self, response: httpx.Response, what: str) -> bytes:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise _bad(f"The BMC compressed its answer to {what} although it was asked not to.")
        declared = response.headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > MAX_BODY_BYTES:
            raise _bad(f"The BMC's answer to {what} is larger than {MAX_BODY_BYTES} bytes.")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_raw():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _bad(f"The BMC's answer to {what} is larger than {MAX_BODY_BYTES} bytes.")
            chunks.append(chunk)
        return b"".join(chunks)

    def _transport_error(self, error: httpx.HTTPError, what: str) -> RedfishError:
        cause: BaseException | None = error
        while cause is not None:
            if isinstance(cause, _PinMismatchError):
                return RedfishError(
                    BMC_TLS_FAILED,
                    # The presented certificate's hash is not shown: a caller who may enroll any URL would learn
                    # the certificates of hosts the control plane reaches, and then pin them.
                    f"The BMC at {self.origin} presented a certificate that does not match the pin; nothing was"
                    " sent to it.",
                )
            if isinstance(cause, ssl.SSLCertVerificationError):
                reason = _excerpt(str(cause.verify_message or cause.reason or "not trusted"), ())
                return RedfishError(BMC_TLS_FAILED, f"The BMC's certificate at {self.origin} did not verify: {reason}.")
            if isinstance(cause, ssl.SSLError) and not isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError):
                reason = _excerpt(str(cause.reason or cause.__class__.__name__), ())
                return RedfishError(
                    BMC_TLS_FAILED, f"The TLS handshake with the BMC at {self.origin} failed: {reason}."
                )
            cause = cause.__cause__ or cause.__context__
        if isinstance(error, httpx.TimeoutException):
            return RedfishError(
                BMC_UNREACHABLE, f"The BMC did not answer {what} within {self._timeout:g} s.", retryable=True
            )
        if isinstance(error, httpx.RemoteProtocolError | httpx.DecodingError):
            return _bad(f"The BMC's answer to {what} is not valid HTTP.")
        if isinstance(error, httpx.TransportError):
            detail = _excerpt(str(error), self._secrets) or type(error).__name__
            return RedfishError(
                BMC_UNREACHABLE, f"The BMC at {self.origin} could not be reached: {detail}.", retryable=True
            )
        return RedfishError(BMC_ERROR, f"The request {what} to the BMC failed: {type(error).__name__}.")

    def _status_error(self, status: int, raw: bytes, what: str) -> RedfishError:
        if status in (401, 403):
            return RedfishError(
                BMC_AUTH_FAILED, f"The BMC refused the credentials ({status} on {what}).", status=status
            )
        if status == 404:
            return RedfishError(BMC_NOT_FOUND, f"The BMC has no {what.partition(' ')[2]} (404).", status=status)
        if 300 <= status < 400:
            return RedfishError(
                BMC_ERROR, f"The BMC redirected {what} ({status}); redirects are not followed.", status=status
            )
        said = self._said(raw)
        return RedfishError(
            BMC_ERROR,
            f"The BMC answered {status} to {what}" + (f": {said}" if said else "."),
            retryable=status >= 500 or status == 429,
            status=status,
        )

    def _said(self, raw: bytes) -> str:
        """A short, cleaned excerpt of a Redfish error body's message (never the body as sent)."""
        try:
            body = json.loads(raw[:16384])
        except (ValueError, RecursionError):
            return ""
        if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
            return ""
        error = body["error"]
        message = error.get("message")
        info = error.get("@Message.ExtendedInfo")
        if isinstance(info, list) and info and isinstance(info[0], dict) and isinstance(info[0].get("Message"), str):
            message = info[0]["Message"]
        return _excerpt(message, self._secrets) if isinstance(message, str) else ""
