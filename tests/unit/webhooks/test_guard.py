"""The SSRF guard's rules, without a network: which addresses are internal, and how a request is pinned."""

from __future__ import annotations

import ipaddress

import pytest

from bettercompute.modules.webhooks import _guard

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",  # noqa: S104 - an address to judge, not to bind
        "224.0.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
    ],
)
def test_internal_addresses_are_not_allowed(address: str) -> None:
    assert not _guard.address_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert _guard.address_allowed(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("2130706433", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("example.com", None),
        ("1e100.net", None),
        ("1.2.3.4.5", None),
    ],
)
def test_literal_addresses_in_every_form_a_resolver_takes(host: str, expected: str | None) -> None:
    found = _guard.literal_address(host)
    assert (str(found) if found is not None else None) == expected


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://localhost/", True),
        ("http://a.b.localhost:81/", True),
        ("http://127.0.0.1:3000/", True),
        ("http://[::1]/", True),
        ("https://hooks.example.com/", False),
        ("https://localhost.example.com/", False),
        ("http://8.8.8.8/", False),
    ],
)
def test_url_problem(url: str, problem: bool) -> None:
    assert (_guard.url_problem(_guard.parse(url)) is not None) is problem


async def test_a_request_is_pinned_to_the_checked_address(monkeypatch: pytest.MonkeyPatch) -> None:
    async def resolve(host: str, port: int) -> list[_guard.Address]:
        assert (host, port) == ("hooks.example.com", 8443)
        return [ipaddress.ip_address("2606:4700::1111"), ipaddress.ip_address("93.184.216.34")]

    monkeypatch.setattr(_guard, "resolve", resolve)
    target = await _guard.pinned("https://hooks.example.com:8443/in?x=1")
    assert str(target.url) == "https://[2606:4700::1111]:8443/in?x=1"
    assert target.headers == {"host": "hooks.example.com:8443"}
    assert target.extensions == {"sni_hostname": "hooks.example.com"}  # TLS still checks the name's certificate


async def test_any_internal_answer_refuses_the_whole_name(monkeypatch: pytest.MonkeyPatch) -> None:
    async def resolve(host: str, port: int) -> list[_guard.Address]:
        return [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("10.0.0.7")]

    monkeypatch.setattr(_guard, "resolve", resolve)
    with pytest.raises(_guard.DestinationRefusedError, match="destination address not allowed"):
        await _guard.pinned("http://hooks.example.com/")


async def test_localhost_is_refused_before_any_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    async def resolve(host: str, port: int) -> list[_guard.Address]:
        raise AssertionError("no lookup expected")

    monkeypatch.setattr(_guard, "resolve", resolve)
    with pytest.raises(_guard.DestinationRefusedError, match="not allowed"):
        await _guard.pinned("http://localhost:8080/")
