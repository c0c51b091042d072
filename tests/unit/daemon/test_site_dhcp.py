"""``bcd site``'s proxy DHCP: what it answers (and does not), the chain rule that sends an iPXE to TFTP first and
to its script after, the reply's fields, and that no bytes a client sends make it raise."""

from __future__ import annotations

import contextlib
import ipaddress
import struct
import uuid

from hypothesis import given
from hypothesis import strategies as st

from bettercompute_daemon._site._dhcp import (
    ChainMarks,
    DhcpPacket,
    MalformedPacket,
    ProxyDhcp,
    parse_packet,
)
from bettercompute_daemon._site._plan import BootEntry, BootPlan, BootRecord

SERVER = "10.77.0.1"
NOWHERE = "0.0.0.0"  # noqa: S104 (a client without an address yet, never bound)
SCRIPT = f"http://{SERVER}:8080/boot.ipxe"
MAC = bytes.fromhex("525400770011")
SYSTEM_UUID = uuid.UUID("43d2d280-8090-4ee4-9b8b-873909821459")
PLAN = BootPlan(entries=(BootEntry(machine_id="m1", macs=("52:54:00:77:00:11",), system_uuid=str(SYSTEM_UUID)),))


def option(code: int, value: bytes) -> bytes:
    return bytes((code, len(value))) + value


def request(
    message_type: int = 1,
    *,
    vendor: bytes = b"PXEClient:Arch:00000:UNDI:002001",
    user_class: bytes | None = b"iPXE",
    arch: int = 0,
    server_id: str | None = None,
    ciaddr: str = NOWHERE,
    extra: bytes = b"",
) -> bytes:
    header = struct.pack(
        "!BBBBIHH4s4s4s4s16s64s128s4s",
        1,
        1,
        6,
        0,
        0x1234ABCD,
        3,
        0x8000,
        ipaddress.IPv4Address(ciaddr).packed,
        b"\0" * 4,
        b"\0" * 4,
        b"\0" * 4,
        MAC.ljust(16, b"\0"),
        b"\0" * 64,
        b"\0" * 128,
        b"\x63\x82\x53\x63",
    )
    options = option(53, bytes((message_type,))) + option(60, vendor) + option(93, arch.to_bytes(2, "big"))
    options += option(97, b"\0" + SYSTEM_UUID.bytes_le)
    if user_class is not None:
        options += option(77, user_class)
    if server_id is not None:
        options += option(54, ipaddress.IPv4Address(server_id).packed)
    return header + options + extra + b"\xff"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def proxy(marks: ChainMarks | None = None) -> tuple[ProxyDhcp, list[BootRecord]]:
    records: list[BootRecord] = []
    server = ProxyDhcp(
        interface="br0",
        address=SERVER,
        script_url=SCRIPT,
        plan=lambda: PLAN,
        marks=marks or ChainMarks(),
        record=records.append,
    )
    return server, records


def answer(server: ProxyDhcp, data: bytes, *, port_67: bool = True) -> tuple[DhcpPacket, tuple[str, int]] | None:
    peer = (NOWHERE, 68) if port_67 else ("10.77.0.114", 68)
    reply = server.handle(data, peer, broadcast_port=port_67)
    if reply is None:
        return None
    return parse_packet(reply[0]), reply[1]


def filename(reply: tuple[DhcpPacket, tuple[str, int]] | None) -> str:
    assert reply is not None
    return reply[0].options[67].decode()


def test_a_proxy_offer_carries_boot_options_and_no_address() -> None:
    server, records = proxy()
    raw = server.handle(request(), (NOWHERE, 68), broadcast_port=True)
    assert raw is not None
    data, destination = raw
    assert destination == ("255.255.255.255", 68)
    offer = parse_packet(data)
    assert offer.op == 2 and offer.xid == 0x1234ABCD and offer.chaddr == MAC and offer.message_type == 2
    assert data[16:20] == b"\0\0\0\0"  # yiaddr: no address
    assert data[20:24] == ipaddress.IPv4Address(SERVER).packed  # siaddr: next server
    assert offer.options[54] == ipaddress.IPv4Address(SERVER).packed
    assert offer.options[60] == b"PXEClient"
    assert offer.options[97] == b"\0" + SYSTEM_UUID.bytes_le
    assert 51 not in offer.options and 1 not in offer.options  # no lease, no netmask
    assert data[108:236].rstrip(b"\0") == b"undionly.kpxe"
    assert [(r.kind, r.mac, r.machine_id, r.system_uuid) for r in records] == [
        ("dhcp", "52:54:00:77:00:11", "m1", str(SYSTEM_UUID))
    ]


def test_only_pxe_clients_get_an_answer() -> None:
    server, records = proxy()
    assert answer(server, request(vendor=b"MSFT 5.0")) is None
    assert answer(server, request(vendor=b"")) is None
    assert answer(server, request(arch=6)) is None  # 32-bit UEFI: the site has no binary for it
    assert records == []


def test_the_binary_suits_the_architecture() -> None:
    server, _ = proxy()
    assert filename(answer(server, request(user_class=None, arch=0))) == "undionly.kpxe"
    assert filename(answer(server, request(user_class=None, arch=7))) == "ipxe.efi"
    assert filename(answer(server, request(user_class=None, arch=9))) == "ipxe.efi"


def test_an_ipxe_is_sent_to_its_script_only_just_after_it_fetched_the_sites_binary() -> None:
    clock = Clock()
    marks = ChainMarks(window=60, clock=clock)
    server, _ = proxy(marks)
    # A NIC ROM that is iPXE already: the site's binary first.
    assert filename(answer(server, request())) == "undionly.kpxe"
    marks.chained("52:54:00:77:00:11")
    assert filename(answer(server, request())) == SCRIPT
    # A plain PXE ROM never gets a URL.
    assert filename(answer(server, request(user_class=None))) == "undionly.kpxe"
    # Asking for its script ends it: the next iPXE of that machine starts over.
    marks.consume("52:54:00:77:00:11")
    assert filename(answer(server, request())) == "undionly.kpxe"
    marks.chained("52:54:00:77:00:11")
    clock.now += 61
    assert filename(answer(server, request())) == "undionly.kpxe"


def test_requests_are_acknowledged_on_4011_and_on_67_only_when_meant_for_us() -> None:
    server, records = proxy()
    assert answer(server, request(3, server_id="10.77.0.2")) is None  # for the site's DHCP server
    ack = answer(server, request(3, server_id=SERVER))
    assert ack is not None and ack[0].message_type == 5 and ack[1] == ("255.255.255.255", 68)
    pxe = answer(server, request(3, ciaddr="10.77.0.114"), port_67=False)
    assert pxe is not None and pxe[0].message_type == 5 and pxe[1] == ("10.77.0.114", 68)
    assert answer(server, request(1), port_67=False) is None  # a discover does not belong on 4011
    assert server._marks.mac_of("10.77.0.114") == "52:54:00:77:00:11"
    assert len(records) == 2


def test_option_77_as_an_rfc_3004_list() -> None:
    server, _ = proxy()
    server._marks.chained("52:54:00:77:00:11")
    assert filename(answer(server, request(user_class=b"\x03abc\x04iPXE"))) == SCRIPT
    assert filename(answer(server, request(user_class=b"\x09iPXE"))) == "undionly.kpxe"


def test_malformed_packets_are_refused() -> None:
    valid = request()
    for bad in (
        b"",
        valid[:100],
        valid[:239],
        valid[:28] + b"\0" * 300,
        valid[:1] + b"\x06" + valid[2:],  # not Ethernet
        valid[:2] + b"\x10" + valid[3:],  # hlen 16
        valid[:236] + b"\0\0\0\0" + valid[240:],  # no magic cookie
        valid[:240] + b"\x35\x09\x01",  # an option running past the end
        valid[:240] + b"\x35",  # an option without its length
        valid + b"\0" * 2000,  # too long
    ):
        try:
            parse_packet(bad)
        except MalformedPacket:
            continue
        raise AssertionError(f"accepted {bad!r}")


@given(st.binary(max_size=2000))
def test_random_bytes_never_raise_anything_else(data: bytes) -> None:
    with contextlib.suppress(MalformedPacket):
        parse_packet(data)
    server, _ = proxy()
    server.handle(data, (NOWHERE, 68), broadcast_port=True)
    server.handle(data, ("10.0.0.9", 68), broadcast_port=False)


@given(st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=12), st.integers(0, 400))
def test_mutated_valid_packets_never_raise(changes: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(request(extra=option(43, b"\x06\x01\x08\xff") + option(175, b"\x13\x01\x01")))
    for position, value in changes:
        if position < len(data):
            data[position] = value
    mutated = bytes(data[: len(data) - cut]) if cut < len(data) else bytes(data)
    server, _ = proxy()
    for port_67 in (True, False):
        reply = server.handle(mutated, ("10.0.0.9", 68), broadcast_port=port_67)
        if reply is not None:
            parse_packet(reply[0])  # whatever it answers is itself well-formed
