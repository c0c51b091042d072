"""Where a webhook may be sent: no internal address (SSRF), checked at ``create`` and again right before each POST.

A URL is read the way the sender's HTTP client (httpx) reads it, never by a second parser: ``parse`` is what
``webhooks.create`` checks and what the sender sends to, so a host spelled with Unicode dots or digits, IDNA, or a
numeric form is judged as the address or name the client will actually use. A URL the client cannot read is refused
at ``create``; its host must then be an IP address or a DNS name (labels of letters, digits, ``-`` and ``_``), and a
host whose last label is a number must be an IPv4 address (``127.1``, ``0x7f.1``, ``2130706433``), as a resolver
would take it.

Unless ``WebhookSettings.allow_private_destinations`` is set:

- ``webhooks.create`` refuses a URL whose host is ``localhost``, a name under ``.localhost``, or an address literal
  (including the legacy numeric forms a resolver accepts, with or without a trailing dot) that is not allowed;
- the sender resolves the host right before each attempt and refuses it when *any* of its addresses is not allowed
  (a name may be repointed after ``create``: DNS rebinding), then connects to the address it checked, not to what a
  second lookup might answer. The ``Host`` header and the TLS server name (SNI, certificate check) stay the URL's.

An address is not allowed when it is loopback, private, link-local (``169.254.169.254``, the cloud metadata service),
multicast, reserved, unspecified or otherwise not globally reachable (``100.64.0.0/10`` too). An IPv6 address that
carries an IPv4 address (IPv4-mapped, 6to4, NAT64) is judged by that IPv4 address as well. With
``WebhookSettings.allow_loopback_destinations`` (what ``better-compute dev`` sets), loopback addresses and
``localhost`` are allowed, and nothing else that is internal.
"""

from __future__ import annotations

import ipaddress
import re
import socket

import anyio
import attrs
import httpx

__all__ = [
    "DestinationRefusedError",
    "Target",
    "address_allowed",
    "literal_address",
    "parse",
    "pinned",
    "readable",
    "resolve",
    "url_problem",
]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

NOT_ALLOWED = "destination address not allowed"
NOT_RESOLVED = "the destination host name does not resolve"
NOT_PARSED = "the destination URL cannot be parsed"

_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*")  # a last label a resolver would read as part of an IPv4 address
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
# Ranges that are not public destinations but that some Python releases' ``is_global`` still counts as global
# (3.11 before the fix for CVE-2024-4032 among them): judged here, whatever the interpreter knows.
_NEVER_GLOBAL = (
    ipaddress.IPv4Network("192.0.0.0/24"),  # IETF protocol assignments
    ipaddress.IPv4Network("192.88.99.0/24"),  # the retired 6to4 relay anycast
    ipaddress.IPv6Network("fec0::/10"),  # site-local, deprecated but still routed inside some networks
    ipaddress.IPv6Network("3fff::/20"),  # documentation
    ipaddress.IPv6Network("2001:db8::/32"),  # documentation
    ipaddress.IPv6Network("2001::/23"),  # IETF protocol assignments (Teredo's 2001::/32 among them)
)


class DestinationRefusedError(Exception):
    """The sender will not POST to this URL now; ``str(exc)`` is the delivery's ``last_error`` (never the URL)."""


def _embedded_ipv4(address: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 address a 6to4 or NAT64 address carries, which a relay or translator would reach."""
    found = [address.sixtofour] if address.sixtofour is not None else []
    if address in _NAT64:
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return found


def address_allowed(address: Address, *, loopback: bool = False) -> bool:
    """Whether a webhook may be sent to ``address``: a globally reachable unicast address (or, with ``loopback``,
    a loopback one)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address_allowed(address.ipv4_mapped, loopback=loopback)
        if not all(address_allowed(a) for a in _embedded_ipv4(address)):
            return False
    if loopback and address.is_loopback:
        return True
    if any(address in network for network in _NEVER_GLOBAL):
        return False
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


def _shape_problem(host: str) -> str | None:
    """Why ``host`` (as httpx encoded it: ASCII, lower case) is neither an IP address nor a DNS name, or ``None``."""
    if ":" in host:  # httpx keeps brackets out of raw_host and only an IPv6 literal has a colon
        if "%" in host:
            # A zone id names an interface of this machine, never a remote receiver.
            return "may not carry an IPv6 zone id"
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "has a host that is not an IPv6 address"
        return None
    name = host[:-1] if host.endswith(".") else host
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return "must name its host as a DNS name (letters, digits, '-', '_') or an IP address"
    if _NUMBER.fullmatch(labels[-1]) and literal_address(name) is None:
        # A resolver would read it as an address (or fail to): it is not a name either.
        return "has a host that is neither a DNS name nor an IPv4 address"
    return None


def _host_problem(host: str, *, loopback: bool = False) -> str | None:
    name = host.lower()
    name = name[:-1] if name.endswith(".") else name
    if name == "localhost" or name.endswith(".localhost"):
        return None if loopback else "may not point at localhost"
    address = literal_address(name)
    if address is not None and not address_allowed(address, loopback=loopback):
        return "may not point at a loopback, private, link-local, multicast or reserved address"
    return None


def parse(url: str) -> httpx.URL:
    """``url`` as the sender's HTTP client reads it, normalized (IDNA, lower-case host, Unicode dots).

    Raises:
        ValueError: the client cannot read it, it is not an absolute http(s) URL, or its host is neither an IP
            address nor a DNS name; ``str(exc)`` says which, without quoting the URL.
    """
    try:
        parsed = httpx.URL(url)
        host = parsed.raw_host.decode("ascii")
    except (httpx.InvalidURL, ValueError):  # UnicodeError (IDNA) is a ValueError
        raise ValueError("cannot be parsed as a URL") from None
    if parsed.scheme not in ("http", "https") or not host:
        raise ValueError("must be an absolute http:// or https:// URL")
    problem = _shape_problem(host)
    if problem is not None:
        raise ValueError(problem)
    for label in host.split("."):
        problem = _idna_label_problem(label)
        if problem is not None:
            raise ValueError(problem)
    return parsed


def _idna_label_problem(label: str) -> str | None:
    """Why an IDNA label (``xn--...``) of a host is refused, or ``None``.

    Each label is decoded on its own, so a label IDNA does not allow elsewhere in the host (``my_hooks``) does not
    spoil the rest, and no decoder's error text (which quotes the host) ever reaches a message.
    """
    if not label.startswith("xn--"):
        return None
    try:
        decoded = label[4:].encode("ascii").decode("punycode")
    except (UnicodeError, ValueError):
        return "cannot be parsed as a URL"
    if decoded.isdecimal():
        # IDNA takes Devanagari or Bengali digits as letters: a name, but one that reads as an address to a person.
        return "may not spell a number in non-ASCII digits"
    return None


def url_problem(url: httpx.URL, *, loopback: bool = False) -> str | None:
    """Why ``webhooks.create`` refuses ``url`` (as ``parse`` returned it) as a destination, or ``None``."""
    return _host_problem(url.raw_host.decode("ascii"), loopback=loopback)


def readable(url: str) -> httpx.URL:
    """A stored URL as ``parse`` reads it, for the sender.

    Raises:
        DestinationRefusedError: it cannot be parsed (a row stored before ``create`` checked with ``parse``).
    """
    try:
        return parse(url)
    except ValueError:
        raise DestinationRefusedError(NOT_PARSED) from None


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


async def pinned(url: str, *, loopback: bool = False) -> Target:
    """Resolve ``url``'s host now and pin the request to a checked address.

    Network I/O (a DNS lookup): call it outside any database transaction.

    Args:
        url: The subscription's URL, as stored (a row from before ``parse`` was checked at ``create`` may be one
            the client cannot read).
        loopback: Allow loopback addresses and ``localhost`` too.

    Raises:
        DestinationRefusedError: the URL cannot be parsed, the host is ``localhost``-like, does not resolve, or
            resolves to any address that is not allowed.
    """
    parsed = readable(url)
    host = parsed.raw_host.decode("ascii")  # IDNA-encoded already
    if _host_problem(host, loopback=loopback) is not None:
        raise DestinationRefusedError(NOT_ALLOWED)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        addresses = await resolve(host, port)
    except (OSError, UnicodeError):
        raise DestinationRefusedError(NOT_RESOLVED) from None
    if not addresses:
        raise DestinationRefusedError(NOT_RESOLVED)
    if not all(address_allowed(a, loopback=loopback) for a in addresses):
        raise DestinationRefusedError(NOT_ALLOWED)
    extensions = {"sni_hostname": host} if parsed.scheme == "https" else {}
    return Target(
        url=parsed.copy_with(host=str(addresses[0])),
        headers={"host": parsed.netloc.decode("ascii")},
        extensions=extensions,
    )
