"""What the Redfish client accepts before it touches a network: BMC URLs, TLS trust, credentials, boot targets."""

from __future__ import annotations

import hashlib
import ssl

import pytest

from bettercompute.errors import InvalidInputError
from bettercompute_metal._redfish import RedfishClient
from bettercompute_metal._redfish_trust import BmcCredentials, BmcTls, certificate_pin, parse_bmc_url

PIN = "a1" * 32


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("https://10.0.0.5", "https://10.0.0.5"),
        ("https://10.0.0.5/", "https://10.0.0.5"),
        ("https://10.0.0.5/redfish/v1", "https://10.0.0.5"),
        ("https://10.0.0.5/redfish/v1/", "https://10.0.0.5"),
        ("HTTPS://BMC-7.Rack3.Example.COM:8443", "https://bmc-7.rack3.example.com:8443"),
        ("https://[2001:DB8::0:1]:443", "https://[2001:db8::1]:443"),
        ("https://xn--bcher-kva.example", "https://xn--bcher-kva.example"),
        ("https://bmc.example.", "https://bmc.example."),
    ],
)
def test_accepted_urls_become_an_origin(url: str, origin: str) -> None:
    assert parse_bmc_url(url) == origin


@pytest.mark.parametrize(
    "url",
    [
        "",
        "10.0.0.5",
        "ftp://10.0.0.5",
        "http://10.0.0.5",  # plain HTTP unless allowed
        "https://",
        "https://:443",
        "https://admin:secret@10.0.0.5",
        "https://admin@10.0.0.5",
        "https://10.0.0.5?x=1",
        "https://10.0.0.5/#frag",
        "https://10.0.0.5/?",
        "https://10.0.0.5/other/path",
        "https://10.0.0.5/redfish/v1/Systems",
        "https://10.0.0.5\x00.evil.example",
        "https://10.0.0.5 /",
        " https://10.0.0.5",
        "https://10.0.0.5\t",
        "https://10.0.0.5\r\nHost: evil",
        "https://bmc.\u0435xample.com",  # a Cyrillic "e" look-alike
        "https://bücher.example",
        "https://10.0.0.5:0",
        "https://10.0.0.5:65536",
        "https://10.0.0.5:+443",
        "https://10.0.0.5:44a",
        "https://10.0.0.5:",
        "https://256.1.1.1",
        "https://10.1",
        "https://010.0.0.1",
        "https://[fe80::1%25eth0]",
        "https://[fe80::1",
        "https://[10.0.0.5]",
        "https://[::1]x",
        "https://-bmc.example",
        "https://bmc..example",
        "https://" + "a" * 64 + ".example",
        "https://bmc_1.example",
        "https://evil.example\\@10.0.0.5",
        "https://" + "a." * 1100 + "example",
    ],
)
def test_refused_urls_name_the_field(url: str) -> None:
    with pytest.raises(InvalidInputError) as raised:
        parse_bmc_url(url, field="bmc.url")
    assert raised.value.details == {"field": "bmc.url"}


def test_plain_http_when_allowed_and_a_non_string() -> None:
    assert parse_bmc_url("http://127.0.0.1:8000", allow_plain_http=True) == "http://127.0.0.1:8000"
    with pytest.raises(InvalidInputError):
        parse_bmc_url(None)
    with pytest.raises(InvalidInputError) as raised:
        RedfishClient("http://127.0.0.1:8000", BmcCredentials("a", "b"), None)
    assert raised.value.details == {"field": "url"}


def test_tls_takes_exactly_one_trust() -> None:
    assert BmcTls(pin_sha256=":".join(["A1"] * 32)).pin_sha256 == PIN
    for kwargs in ({}, {"pin_sha256": PIN, "ca_pem": "x"}):
        with pytest.raises(InvalidInputError) as raised:
            BmcTls(**kwargs)
        assert raised.value.details == {"field": "tls"}
    with pytest.raises(InvalidInputError) as raised:
        BmcTls(pin_sha256="a1" * 31)
    assert raised.value.details == {"field": "tls.pin_sha256"}
    with pytest.raises(InvalidInputError) as raised:
        BmcTls(ca_pem="-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    assert raised.value.details == {"field": "tls.ca_pem"}
    with pytest.raises(InvalidInputError) as raised:
        RedfishClient("https://10.0.0.5", BmcCredentials("a", "b"), None)
    assert raised.value.details == {"field": "tls"}


def test_certificate_pin_is_the_sha256_of_the_der() -> None:
    der = b"\x30\x03\x02\x01\x01"
    pem = ssl.DER_cert_to_PEM_cert(der)
    assert certificate_pin(der) == certificate_pin(pem) == hashlib.sha256(der).hexdigest()


def test_credentials_hide_the_password() -> None:
    credentials = BmcCredentials("admin", "hunter2-secret")
    assert "hunter2" not in repr(credentials) and "hunter2" not in str(credentials)
    assert "admin" in repr(credentials)
    for username, password, field in [
        ("", "x", "credentials.username"),
        ("a:b", "x", "credentials.username"),
        ("a\nb", "x", "credentials.username"),
        ("a", "", "credentials.password"),
        ("a", "pa\x00ss", "credentials.password"),
        ("a", "x" * 257, "credentials.password"),
    ]:
        with pytest.raises(InvalidInputError) as raised:
            BmcCredentials(username, password)
        assert raised.value.details == {"field": field}
        assert password not in raised.value.message or not password


@pytest.mark.anyio
async def test_boot_targets_and_actions_are_checked_before_any_request() -> None:
    client = RedfishClient("https://10.0.0.5", BmcCredentials("a", "b"), BmcTls(pin_sha256=PIN))
    for target in ("", "Pxe;rm", "P x e", "Pxe\n", "1Pxe", "x" * 33):
        with pytest.raises(InvalidInputError) as raised:
            await client.set_boot_once(target)
        assert raised.value.details == {"field": "target"}
    with pytest.raises(InvalidInputError):
        await client.power("explode")  # type: ignore[arg-type]
