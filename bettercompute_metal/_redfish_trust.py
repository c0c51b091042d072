"""How a BMC is named and trusted: its URL, its TLS, its account.

Trust in the BMC is explicit (``BmcTls``): either a CA that signed the BMC's certificate (chain and host name are
checked) or the SHA-256 of the certificate itself, which is how most BMCs' self-signed certificates are trusted. With
a pin, the check runs inside the TLS handshake of every connection, before a byte of HTTP (and so before the
``Authorization`` header) is written: see ``PinnedSSLObject``. An operator's BMC URL is taken only in one spelling
(``parse_bmc_url``), and credentials never travel in it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import ssl
import urllib.parse
from typing import ClassVar, Final

import attrs
from cryptography import x509

from bettercompute.errors import InvalidInputError

__all__ = [
    "MAX_URL_CHARS",
    "ROOT",
    "BmcCredentials",
    "BmcTls",
    "PinMismatchError",
    "PinnedSSLObject",
    "certificate_pin",
    "invalid_input",
    "parse_bmc_url",
]

MAX_URL_CHARS: Final = 2048
ROOT: Final = "/redfish/v1"
"""The Redfish service root: the only path a BMC URL may have, and the prefix of every link followed."""

_PIN = re.compile(r"[0-9a-f]{64}")
_DNS_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")


def invalid_input(field: str, message: str) -> InvalidInputError:
    """An ``INVALID_INPUT`` naming the input field at fault."""
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
        raise invalid_input(field, "The BMC URL must be a non-empty string.")
    if len(url) > MAX_URL_CHARS:
        raise invalid_input(field, f"The BMC URL is longer than {MAX_URL_CHARS} characters.")
    if not _printable_ascii(url):
        raise invalid_input(
            field,
            "The BMC URL may hold only printable ASCII: no spaces, control characters or non-ASCII letters "
            "(write an international host name in its xn-- form).",
        )
    if "@" in url.partition("://")[2].partition("/")[0]:
        raise invalid_input(field, "The BMC URL may not carry a user name or password; give them as credentials.")
    if "?" in url or "#" in url:
        raise invalid_input(field, "The BMC URL may not have a query or a fragment.")
    if "\\" in url:
        raise invalid_input(field, "The BMC URL may not contain a backslash.")
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # an unclosed or misused bracket, which urlsplit itself refuses
        raise invalid_input(field, "The BMC URL is not a valid URL.") from None
    scheme = parts.scheme.lower()
    if scheme == "http" and not allow_plain_http:
        raise invalid_input(field, "The BMC URL must use https: credentials are never sent in the clear.")
    if scheme not in ("https", "http"):
        raise invalid_input(field, "The BMC URL must start with https://.")
    if parts.path.rstrip("/") not in ("", ROOT):
        raise invalid_input(field, f"The BMC URL may have no path other than {ROOT}.")
    host, port = _split_netloc(parts.netloc, field)
    return f"{scheme}://{host}" + (f":{port}" if port is not None else "")


def _split_netloc(netloc: str, field: str) -> tuple[str, int | None]:
    port_text: str | None = None
    if netloc.startswith("["):
        end = netloc.find("]")
        if end < 0:
            raise invalid_input(field, "The BMC URL's IPv6 address has no closing bracket.")
        host_text, rest = netloc[1:end], netloc[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise invalid_input(field, "The BMC URL has something after its IPv6 address that is not a port.")
            port_text = rest[1:]
        if "%" in host_text:
            raise invalid_input(field, "The BMC URL may not use an IPv6 zone id.")
        try:
            host = f"[{ipaddress.IPv6Address(host_text).compressed}]"
        except ValueError:
            raise invalid_input(field, "The BMC URL's bracketed host is not an IPv6 address.") from None
    else:
        host_text, colon, port_part = netloc.partition(":")
        if colon:
            port_text = port_part
        host = host_text.lower()
        if not host:
            raise invalid_input(field, "The BMC URL has no host.")
        if not _valid_host(host):
            raise invalid_input(field, "The BMC URL's host is neither an IPv4 address nor a valid DNS name.")
    port: int | None = None
    if port_text is not None:
        # int() alone would take "+80", " 80" or "0080"-style oddities; only plain digits are a port.
        if not port_text.isdigit() or not 1 <= len(port_text) <= 5 or not 1 <= int(port_text) <= 65535:
            raise invalid_input(field, "The BMC URL's port must be a number from 1 to 65535.")
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
            raise invalid_input("tls", "Give exactly one of a CA certificate and a certificate pin for the BMC.")
        if self.pin_sha256 is not None and not _PIN.fullmatch(self.pin_sha256):
            raise invalid_input("tls.pin_sha256", "The certificate pin must be a SHA-256 as 64 hex digits.")
        if self.ca_pem is not None:
            try:
                x509.load_pem_x509_certificates(self.ca_pem.encode())
            except ValueError:
                raise invalid_input("tls.ca_pem", "The BMC's CA is not a PEM certificate.") from None

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
            context.sslobject_class = type("PinnedSSLObject", (PinnedSSLObject,), {"pin_sha256": self.pin_sha256})
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context


class PinMismatchError(ssl.SSLCertVerificationError):
    """The BMC presented a certificate other than the pinned one (raised from inside the handshake)."""

    def __init__(self, presented: str) -> None:
        super().__init__(f"the certificate's SHA-256 is {presented or 'absent'}, not the pinned one")
        self.presented = presented
        self.verify_message = "certificate does not match the pin"


class PinnedSSLObject(ssl.SSLObject):
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
            raise PinMismatchError(presented)


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
            raise invalid_input(
                "credentials.username",
                "The BMC user name must be 1 to 256 characters with no colon or control character.",
            )
        if not self.password or len(self.password) > 256 or _has_control(self.password):
            raise invalid_input(
                "credentials.password", "The BMC password must be 1 to 256 characters with no control character."
            )

    def __repr__(self) -> str:
        return f"BmcCredentials(username={self.username!r}, password='***')"

    __str__ = __repr__


def _has_control(text: str) -> bool:
    return any(ord(char) < 0x20 or ord(char) == 0x7F for char in text)
