"""Destinations as the sender's HTTP client reads them: every spelling of a host is judged as the address or name
httpx will connect to, and whatever ``create`` accepts, the sender can send to."""

from __future__ import annotations

import ipaddress

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bettercompute.modules.webhooks import _guard
from tests.strategies import INVISIBLE_MARKS, UNICODE_DIGITS, UNICODE_DOTS, hostish_text, internal_ipv4_addresses


def refused(url: str, *, loopback: bool = False) -> bool:
    """Whether ``webhooks.create`` (the SSRF guard on) refuses ``url``: unparsable, or internal."""
    try:
        parsed = _guard.parse(url)
    except ValueError:
        return True
    return _guard.url_problem(parsed, loopback=loopback) is not None


def _forms(address: ipaddress.IPv4Address) -> list[str]:
    """``address`` written every way some resolver or URL parser reads as that address."""
    a, b, c, d = address.packed
    value = int(address)
    dotted = str(address)
    forms = [
        dotted,
        f"{dotted}.",
        str(value),
        f"{value}.",
        hex(value),
        f"0x{value:08X}",
        f"{a}.{(b << 16) | (c << 8) | d}",
        f"{a}.{b}.{(c << 8) | d}",
        f"0{a:o}.0{b:o}.0{c:o}.0{d:o}",
        f"0x{a:x}.0x{b:x}.0x{c:x}.0x{d:x}",
        f"00{a}.{b}.{c}.{d}",
        f"[::ffff:{dotted}]",
        f"[::ffff:{value >> 16:x}:{value & 0xFFFF:x}]",
        f"[0:0:0:0:0:ffff:{dotted}]",
        f"[::{dotted}]",
        f"[64:ff9b::{dotted}]",
        f"[2002:{value >> 16:x}:{value & 0xFFFF:x}::1]",
    ]
    forms += [dotted.replace(".", dot) for dot in UNICODE_DOTS]
    for zero in UNICODE_DIGITS.values():
        forms.append("".join(chr(zero + int(ch)) if ch.isdigit() else ch for ch in dotted))
    forms += [dotted + mark for mark in INVISIBLE_MARKS] + [mark + dotted for mark in INVISIBLE_MARKS]
    return forms


@given(address=internal_ipv4_addresses(), port=st.sampled_from(["", ":80", ":8443"]))
def test_every_form_of_an_internal_ipv4_address_is_refused(address: ipaddress.IPv4Address, port: str) -> None:
    for form in _forms(address):
        url = f"http://{form}{port}/hook"
        assert refused(url), url


@pytest.mark.parametrize("form", _forms(ipaddress.IPv4Address("127.0.0.1")))
def test_loopback_in_any_form_is_refused_and_only_clean_loopback_passes_in_loopback_mode(form: str) -> None:
    url = f"http://{form}:3000/hook"
    assert refused(url)
    # With loopback allowed (better-compute dev), what the client reads as loopback passes, nothing unreadable does.
    try:
        host = _guard.parse(url).raw_host.decode()
    except ValueError:
        assert refused(url, loopback=True)
        return
    judged = _guard.literal_address(host.rstrip("."))
    assert judged is not None
    assert refused(url, loopback=True) == (not judged.is_loopback and getattr(judged, "ipv4_mapped", None) is None)


@pytest.mark.parametrize(
    "url",
    [
        "http://[fe80::1%25eth0]/",  # a zone id names an interface of this machine
        "http://[2606:4700::1%25eth0]/",
        "http://[2002:a9fe:a9fe::]/",  # 6to4 of 169.254.169.254
        "http://[64:ff9b::a00:1]/",  # NAT64 of 10.0.0.1
        "http://1.2.3.4.5/",  # a number for a last label that is no IPv4 address
        "http://999.1.1.1/",
        "http://08.0.0.1/",
        "http://0x/",
        "http://ex%41mple.com/",  # percent-encoding in a host
        "http://a..b/",
        "http://exa_mple.com\u202e/",
        "http://\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54/",  # full-width letters
        "http://localhost\u3002/",
        "http://LOCALHOST./",
        "http://[::1]./",
        "ftp://hooks.example.com/",
        "http://hooks.xn--e4bcp/",  # a later label of Devanagari digits (127)
        "http://[fec0::1]/",  # site-local IPv6
        "http://[3fff::1]/",  # documentation ranges some interpreters count as global
        "http://192.0.0.170/",
        "http://192.88.99.1/",
        "http:///path-only",
    ],
)
def test_odd_hosts_are_refused(url: str) -> None:
    assert refused(url)


@pytest.mark.parametrize(
    ("url", "stored"),
    [
        ("https://Hooks.Example.COM/In?x=1", "https://hooks.example.com/In?x=1"),
        ("https://bücher.de/h", "https://xn--bcher-kva.de/h"),
        ("https://hooks\u3002example\u3002com/h", "https://hooks.example.com/h"),
        ("https://hooks.example.com./h", "https://hooks.example.com./h"),
        ("https://[2606:4700::1]/", "https://[2606:4700::1]/"),
        ("http://93.184.216.34:8080/h", "http://93.184.216.34:8080/h"),
        ("https://[2002:5db8:d822::1]/", "https://[2002:5db8:d822::1]/"),  # 6to4 of a public address
        ("https://1e100.net/", "https://1e100.net/"),
        ("https://my_hooks.example.com/", "https://my_hooks.example.com/"),
        ("https://xn--bcher-kva.my_hooks.example.com/", "https://xn--bcher-kva.my_hooks.example.com/"),
        ("https://a.xn--11b5bs3a9aj6g/", "https://a.xn--11b5bs3a9aj6g/"),  # a Devanagari word, not digits
    ],
)
def test_public_destinations_are_normalized_the_way_the_client_sends_them(url: str, stored: str) -> None:
    assert not refused(url)
    assert str(_guard.parse(url)) == stored


@given(host=hostish_text(), rest=st.text(max_size=20))
def test_what_create_accepts_the_sender_reads_back_unchanged(host: str, rest: str) -> None:
    url = f"http://{host}/{rest}"
    try:
        parsed = _guard.parse(url)  # only ValueError may come out, whatever the text
    except ValueError:
        return
    stored = str(parsed)
    # The sender reads the stored form without error, as the same destination, and can build the request.
    again = _guard.readable(stored)
    assert again.raw_host == parsed.raw_host and str(again) == stored
    httpx.Request("POST", again)


@pytest.mark.parametrize(
    "url",
    [
        "http://xn--9999999999.example.com/",  # a label that is not valid punycode
        "http://hooks.xn--9999999999.example/",
        "http://xn--\ud800a.example/",
    ],
)
def test_an_undecodable_idna_label_is_refused_without_quoting_it(url: str) -> None:
    with pytest.raises(ValueError) as refusal:
        _guard.parse(url)
    message = str(refusal.value)
    assert message in (
        "cannot be parsed as a URL",
        "must name its host as a DNS name (letters, digits, '-', '_') or an IP address",
    )
    assert "xn--" not in message
