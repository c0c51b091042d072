"""The site's proxy DHCP server (PXE's "proxyDHCP"), on plain stdlib sockets.

It never hands out addresses: the site's own DHCP server does that. Alongside it, this server answers PXE clients
(option 60 starting with ``PXEClient``) with the boot options only: ``yiaddr`` 0.0.0.0, no lease, ``siaddr`` and
option 54 our address, option 60 ``PXEClient`` (iPXE takes only such an offer as a proxy offer), option 97 echoed,
option 43 telling a PXE ROM to use the file named here without boot-server discovery, and the boot file. Offers go
out as broadcasts from UDP 67 (bound to the interface); the PXE boot-server request a client then sends to UDP 4011
is acknowledged from 4011 to the address it came from.

Which boot file: a client that is not iPXE (option 77 is not ``iPXE``) gets the site's iPXE binary over TFTP
(``undionly.kpxe`` for BIOS, ``ipxe.efi`` for x86-64 UEFI, option 93). An iPXE client gets the URL of the site's
iPXE script, but only if it fetched the site's binary over TFTP in the last ``CHAIN_WINDOW`` seconds and has not
asked for its script since; any other iPXE client gets the binary as well. That is the rule because many NICs (and
every QEMU NIC) already carry an iPXE ROM of some unknown build and configuration: every machine then runs the
site's own iPXE, and one DHCP exchange after that binary was served leads to the script. A machine whose iPXE
binary fails to come up within the window simply starts over from TFTP.

Malformed packets (short, a wrong magic cookie, not Ethernet, an option running past the end, too long) are dropped
with a debug log; nothing a client sends can raise out of the receive loop.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import socket
import struct
import time
import uuid
from collections.abc import Callable
from typing import cast

import attrs

from ._plan import BootPlan, BootRecord

__all__ = [
    "BIOS_FILE",
    "CHAIN_WINDOW",
    "EFI_FILE",
    "ChainMarks",
    "DhcpPacket",
    "MalformedPacket",
    "ProxyDhcp",
    "boot_filename",
    "build_reply",
    "parse_packet",
]

log = logging.getLogger("bcd.site")

BIOS_FILE = "undionly.kpxe"
EFI_FILE = "ipxe.efi"
CHAIN_WINDOW = 60.0
"""Seconds after a TFTP download of the site's iPXE during which that machine's iPXE is sent to its script."""

MAX_PACKET = 1500
"""Longer datagrams are dropped (a DHCP message fits in one Ethernet frame unless option 57 says otherwise, and no
PXE client needs more)."""

_MAGIC = b"\x63\x82\x53\x63"
_HEADER = struct.Struct("!BBBBIHH4s4s4s4s16s64s128s4s")
_DISCOVER, _OFFER, _REQUEST, _ACK, _INFORM = 1, 2, 3, 5, 8
# Option 93's client architectures: 0 BIOS (x86), 7 and 9 x86-64 UEFI.
_ARCH_FILES = {0: BIOS_FILE, 7: EFI_FILE, 9: EFI_FILE}
_NO_ADDRESS = "0.0.0.0"  # noqa: S104 (compared with, never bound)


class MalformedPacket(ValueError):
    """The bytes are not a DHCP message this server can answer."""


@attrs.frozen(kw_only=True)
class DhcpPacket:
    """A parsed BOOTP/DHCP message (Ethernet only); repeated options are joined (RFC 3396)."""

    op: int
    xid: int
    secs: int
    flags: int
    ciaddr: str
    giaddr: str
    chaddr: bytes
    """The client's hardware address, its six bytes."""
    options: dict[int, bytes]

    @property
    def mac(self) -> str:
        """The client's MAC as ``aa:bb:cc:dd:ee:ff``."""
        return ":".join(f"{b:02x}" for b in self.chaddr)

    @property
    def message_type(self) -> int | None:
        """Option 53, or ``None`` (a plain BOOTP message)."""
        value = self.options.get(53)
        return value[0] if value is not None and len(value) == 1 else None

    @property
    def is_pxe(self) -> bool:
        """Option 60 starts with ``PXEClient``."""
        return self.options.get(60, b"").startswith(b"PXEClient")

    @property
    def is_ipxe(self) -> bool:
        """Option 77 is ``iPXE``, as iPXE sends it (raw), or as an RFC 3004 list that holds it."""
        value = self.options.get(77, b"")
        if value == b"iPXE":
            return True
        i = 0
        while i < len(value):
            length = value[i]
            if i + 1 + length > len(value):
                return False  # a malformed list
            if value[i + 1 : i + 1 + length] == b"iPXE":
                return True
            i += 1 + length
        return False

    @property
    def arch(self) -> int | None:
        """The first client architecture of option 93, or ``None``."""
        value = self.options.get(93, b"")
        return int.from_bytes(value[:2], "big") if len(value) >= 2 else None

    @property
    def system_uuid(self) -> str | None:
        """Option 97 (type 0 and 16 bytes) as a UUID string, ``None`` if absent. Clients send the SMBIOS bytes as
        they are, the first three fields little-endian (as a GUID), which is how it is read here."""
        value = self.options.get(97, b"")
        if len(value) != 17 or value[0] != 0:
            return None
        return str(uuid.UUID(bytes_le=value[1:]))


def parse_packet(data: bytes) -> DhcpPacket:
    """Parse one DHCP message.

    Raises:
        MalformedPacket: anything short of a well-formed Ethernet DHCP message.
    """
    if len(data) > MAX_PACKET:
        raise MalformedPacket(f"{len(data)} bytes is too long")
    if len(data) < _HEADER.size:
        raise MalformedPacket(f"{len(data)} bytes is too short")
    op, htype, hlen, _hops, xid, secs, flags, ciaddr, _yi, _si, giaddr, chaddr, _sname, _file, magic = (
        _HEADER.unpack_from(data)
    )
    if op not in (1, 2):
        raise MalformedPacket(f"op {op}")
    if htype != 1 or hlen != 6:
        raise MalformedPacket(f"hardware type {htype}, length {hlen}: not Ethernet")
    if magic != _MAGIC:
        raise MalformedPacket("no DHCP magic cookie")
    options: dict[int, bytes] = {}
    i = _HEADER.size
    while i < len(data):
        code = data[i]
        if code == 0:
            i += 1
            continue
        if code == 255:
            break
        if i + 1 >= len(data):
            raise MalformedPacket(f"option {code} has no length")
        length = data[i + 1]
        end = i + 2 + length
        if end > len(data):
            raise MalformedPacket(f"option {code} runs {end - len(data)} bytes past the end")
        options[code] = options.get(code, b"") + data[i + 2 : end]
        i = end
    return DhcpPacket(
        op=op,
        xid=xid,
        secs=secs,
        flags=flags,
        ciaddr=str(ipaddress.IPv4Address(ciaddr)),
        giaddr=str(ipaddress.IPv4Address(giaddr)),
        chaddr=chaddr[:6],
        options=options,
    )


def _option(code: int, value: bytes) -> bytes:
    return bytes((code, len(value))) + value


def build_reply(request: DhcpPacket, *, message_type: int, server: str, filename: str) -> bytes:
    """A proxy reply to ``request``: no address (``yiaddr`` 0.0.0.0), our address as ``siaddr`` and server id, and
    ``filename`` both in the ``file`` field and as option 67."""
    name = filename.encode()
    if len(name) > 127:
        raise ValueError("a boot file name longer than 127 bytes does not fit the file field")
    server_bytes = ipaddress.IPv4Address(server).packed
    header = _HEADER.pack(
        2,
        1,
        6,
        0,
        request.xid,
        0,
        request.flags,
        ipaddress.IPv4Address(request.ciaddr).packed,
        b"\0" * 4,
        server_bytes,
        ipaddress.IPv4Address(request.giaddr).packed,
        request.chaddr.ljust(16, b"\0"),
        b"\0" * 64,
        name.ljust(128, b"\0"),
        _MAGIC,
    )
    options = [
        _option(53, bytes((message_type,))),
        _option(54, server_bytes),
        _option(60, b"PXEClient"),
        # PXE_DISCOVERY_CONTROL = 8: boot the file named in this packet, no boot-server discovery (for PXE ROMs)
        _option(43, _option(6, b"\x08") + b"\xff"),
        _option(67, name),
    ]
    if 97 in request.options and len(request.options[97]) <= 255:
        options.append(_option(97, request.options[97]))
    return header + b"".join(options) + b"\xff"


class ChainMarks:
    """Which machines were just sent the site's iPXE over TFTP (by MAC), so that their next iPXE DHCP exchange gets
    the script; and which client IP belongs to which MAC, as seen in DHCP."""

    def __init__(self, window: float = CHAIN_WINDOW, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._chained: dict[str, float] = {}
        self._macs: dict[str, str] = {}

    def chained(self, mac: str) -> None:
        """``mac`` finished downloading the site's iPXE binary."""
        self._chained[mac] = self._clock()

    def consume(self, mac: str) -> None:
        """``mac`` asked for its script: its next iPXE (a kernel that is iPXE, a reboot) starts over from TFTP."""
        self._chained.pop(mac, None)

    def is_chained(self, mac: str) -> bool:
        """Did ``mac`` download the site's iPXE within the window (and not ask for its script since)?"""
        at = self._chained.get(mac)
        return at is not None and self._clock() - at <= self.window

    def saw(self, ip: str, mac: str) -> None:
        """``ip`` is ``mac``'s address (a DHCP message from it said so)."""
        if ip != _NO_ADDRESS:
            if len(self._macs) > 65536:  # a flood of made-up addresses does not grow this without bound
                self._macs.clear()
            self._macs[ip] = mac

    def mac_of(self, ip: str) -> str | None:
        """The MAC of ``ip`` as seen in DHCP, else as the kernel's ARP table has it."""
        return self._macs.get(ip) or _arp_lookup(ip)


def _arp_lookup(ip: str) -> str | None:
    try:
        with open("/proc/net/arp") as table:
            for line in table.readlines()[1:]:
                fields = line.split()
                if len(fields) >= 4 and fields[0] == ip and fields[3] != "00:00:00:00:00:00":
                    return fields[3].lower()
    except OSError:
        return None
    return None


def boot_filename(packet: DhcpPacket, *, chained: bool, script_url: str) -> str | None:
    """The boot file for a PXE client: the script's URL for an iPXE that is the site's own (``chained``), else the
    iPXE binary for its architecture; ``None`` for an architecture the site has no binary for."""
    if packet.is_ipxe and chained:
        return script_url
    arch = packet.arch
    return _ARCH_FILES.get(0 if arch is None else arch)


class ProxyDhcp:
    """Proxy DHCP on ``interface`` (UDP 67 and 4011), answering as ``address``."""

    def __init__(
        self,
        *,
        interface: str,
        address: str,
        script_url: str,
        plan: Callable[[], BootPlan],
        marks: ChainMarks,
        record: Callable[[BootRecord], None],
        dhcp_port: int = 67,
        pxe_port: int = 4011,
        client_port: int = 68,
    ) -> None:
        self.interface = interface
        self.address = address
        self.script_url = script_url
        self._plan = plan
        self._marks = marks
        self._record = record
        self._ports = (dhcp_port, pxe_port, client_port)
        self._transports: list[asyncio.DatagramTransport] = []

    async def start(self) -> None:
        """Bind both sockets and start answering."""
        loop = asyncio.get_running_loop()
        dhcp_port, pxe_port, _ = self._ports
        for port, broadcast in ((dhcp_port, True), (pxe_port, False)):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                # REUSEADDR: a DHCP server on the same host may hold port 67 too (dnsmasq --bind-interfaces does
                # the same); each then sees the broadcasts.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.interface.encode())
                sock.bind(("0.0.0.0", port))  # noqa: S104 (broadcasts reach only a wildcard socket; the device limits it)
                sock.setblocking(False)
            except OSError:
                sock.close()
                self.stop()
                raise
            transport, _ = await loop.create_datagram_endpoint(
                functools.partial(_Endpoint, self, broadcast=broadcast), sock=sock
            )
            self._transports.append(transport)

    def stop(self) -> None:
        """Close the sockets."""
        for transport in self._transports:
            transport.close()
        self._transports.clear()

    def handle(
        self, data: bytes, peer: tuple[str, int], *, broadcast_port: bool
    ) -> tuple[bytes, tuple[str, int]] | None:
        """The reply to one datagram and where to send it, or ``None``: the whole of the decision, without sockets."""
        try:
            packet = parse_packet(data)
        except MalformedPacket as exc:
            log.debug("dropped a malformed DHCP packet from %s: %s", peer[0], exc)
            return None
        if packet.op != 1 or not packet.is_pxe:
            return None
        kind = packet.message_type
        if broadcast_port:
            server_id = packet.options.get(54)
            if kind == _DISCOVER:
                reply_type = _OFFER
            elif kind == _REQUEST and server_id == ipaddress.IPv4Address(self.address).packed:
                reply_type = _ACK
            else:
                return None  # a request for the site's DHCP server, or a decline, release, ...
        elif kind in (_REQUEST, _INFORM):
            reply_type = _ACK
        else:
            return None
        mac = packet.mac
        if peer[0] != _NO_ADDRESS:
            self._marks.saw(peer[0], mac)
        if packet.ciaddr != _NO_ADDRESS:
            self._marks.saw(packet.ciaddr, mac)
        filename = boot_filename(packet, chained=self._marks.is_chained(mac), script_url=self.script_url)
        entry = self._plan().find(mac, packet.system_uuid)
        what = "offer" if reply_type == _OFFER else "ack"
        if filename is None:
            log.debug("no iPXE binary for %s (architecture %s)", mac, packet.arch)
            return None
        reply = build_reply(packet, message_type=reply_type, server=self.address, filename=filename)
        self._record(
            BootRecord(
                kind="dhcp",
                mac=mac,
                system_uuid=packet.system_uuid,
                machine_id=entry.machine_id if entry is not None else None,
                detail=f"{what} {filename} (arch {packet.arch}, {'iPXE' if packet.is_ipxe else 'PXE'})",
                at=time.time(),
            )
        )
        if broadcast_port:
            return reply, ("255.255.255.255", self._ports[2])
        return reply, peer


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, server: ProxyDhcp, *, broadcast: bool) -> None:
        self.server = server
        self.broadcast = broadcast
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (Python 3.11's selector datagram transport does not subclass DatagramTransport, though it is one.)
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | object, int]) -> None:
        try:
            answer = self.server.handle(data, (str(addr[0]), int(addr[1])), broadcast_port=self.broadcast)
            if answer is not None and self.transport is not None:
                self.transport.sendto(*answer)
        except Exception:  # one client's packet never ends the server
            log.exception("the proxy DHCP server failed on a packet")

    def error_received(self, exc: Exception) -> None:
        log.debug("proxy DHCP socket error: %s", exc)
