"""Where a webhook may be sent: no internal address (SSRF), checked at ``create`` and again right before each POST.

Unless ``WebhookSettings.allow_private_destinations`` is set:

- ``webhooks.create`` refuses a URL whose host is ``localhost``, a name under ``.localhost``, or an address literal
  (including the legacy numeric forms a resolver accepts, ``127.1`` or ``2130706433``) that is not allowed;
- the sender resolves the host right before each attempt and refuses it when *any* of its addresses is not allowed
  (a name may be repointed after ``create``: DNS rebinding), then connects to the address it checked, not to what a
  second lookup might answer. The ``Host`` header and the TLS server name (SNI, certificate check) stay the URL's.

An address is not allowed when it is loopback, private, link-local (``169.254.169.254``, the cloud metadata service),
multicast, reserved, unspecified or otherwise not globally reachable (``100.64.0.0/10`` too). An IPv4-mapped IPv6
address is judged by its IPv4 address.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse

import anyio
import attrs
import httpx

__all__ = [
    "DestinationRefusedError",
    "Target",
    "address_allowed",
    "literal_address",
    "pinned",
    "resolve",
    "url_problem",
]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

NOT_ALLOWED = "destination address not allowed"
NOT_RESOLVED = "the destination host name does not resolve"


class DestinationRefusedError(Exception):
    """The sender will not POST to this URL now; ``str(exc)`` is the delivery's ``last_error`` (never the URL)."""


def address_allowed(address: Address) -> bool:
    """Whether a webhook may be sent to ``address``: a globally reachable unicast address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return not (
        address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
        or not address.is_global
    )


def literal_address(host: str) -> Address | None:
    """The address ``host`` spells, in standard or legacy numeric form (``0x7f.1``), or ``None`` for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    # inet_aton parses (no lookup) the forms getaddrinfo also takes as an address: "127.1", "2130706433", "0x7f.1".
    if host[:1].isdigit() and all(c in "0123456789abcdefx." for c in host.lower()):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def _host_problem(host: str) -> str | None:
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return "may not point at localhost"
    address = literal_address(host)
    if address is not None and not address_allowed(address):
        return "may not point at a loopback, private, link-local, multicast or reserved address"
    return None


def url_problem(url: str) -> str | None:
    """Why ``webhooks.create`` refuses ``url`` (already a valid http(s) URL) as a destination, or ``None``."""
    host = urllib.parse.urlsplit(url).hostname or ""
    return _host_problem(host)


async def resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to now, in the resolver's order (a DNS lookup in a worker thread)."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(info[4][0]) for info in infos]


@attrs.frozen(kw_only=True)
class Target:
    """What to send to: the URL with its host replaced by a checked address, and what keeps the original name."""

    url: httpx.URL
    headers: dict[str, str]
    extensions: dict[str, str]


async def pinned(url: str) -> Target:
    """Resolve ``url``'s host now and pin the request to a checked address.

    Network I/O (a DNS lookup): call it outside any database transaction.

    Raises:
        DestinationRefusedError: the host is ``localhost``-like, does not resolve, or resolves to any address that
            is not allowed.
    """
    parsed = httpx.URL(url)
    host = parsed.raw_host.decode("ascii")  # IDNA-encoded already
    if _host_problem(host) is not None:
        raise DestinationRefusedError(NOT_ALLOWED)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        addresses = await resolve(host, port)
    except (OSError, UnicodeError):
        raise DestinationRefusedError(NOT_RESOLVED) from None
    if not addresses:
        raise DestinationRefusedError(NOT_RESOLVED)
    if not all(address_allowed(a) for a in addresses):
        raise DestinationRefusedError(NOT_ALLOWED)
    extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
    return Target(
        url=parsed.copy_with(host=str(addresses[0])),
        headers={"host": parsed.netloc.decode("ascii")},
        extensions=extensions,
    )
