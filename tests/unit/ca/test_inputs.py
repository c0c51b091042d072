"""The CA's input checks, which run before it touches the store or the KMS."""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from bettercompute.errors import InvalidConfigError, InvalidInputError
from bettercompute.modules.nodes import CertificateAuthority, serial_hex

pytestmark = pytest.mark.anyio


class Untouchable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store or KMS was used ({name}) before the input was checked")


def make_ca() -> CertificateAuthority:
    return CertificateAuthority(cast(Any, Untouchable()), cast(Any, Untouchable()), trust_domain="td.test")


def make_csr(key: Any, *, dns_san: bool = False) -> str:
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")])
    )
    if dns_san:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName("evil.test")]), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def test_spiffe_ids_and_roles() -> None:
    ca = make_ca()
    assert ca.spiffe_id("n-1") == "spiffe://td.test/node/n-1"
    assert ca.spiffe_id("s.1", "site") == "spiffe://td.test/site/s.1"
    assert ca.spiffe_id("n_1", "ramdisk") == "spiffe://td.test/ramdisk/n_1"
    for node_id in ("", ".", "..", "a/b", "a b", "x" * 129):
        with pytest.raises(InvalidInputError):
            ca.spiffe_id(node_id)
    with pytest.raises(InvalidInputError):
        ca.spiffe_id("n-1", "root")


def test_trust_domain_is_checked() -> None:
    for bad in ("", "Upper.test", "a/b", "spiffe://x"):
        with pytest.raises(InvalidConfigError):
            CertificateAuthority(cast(Any, None), cast(Any, None), trust_domain=bad)


def test_serials() -> None:
    assert serial_hex(255) == "ff"
    assert serial_hex("00FF") == "ff"
    assert serial_hex("0xff") == "ff"
    for bad in ("", "zz", "0", 0, -1):
        with pytest.raises(InvalidInputError):
            serial_hex(bad)


async def test_refusals_come_before_any_store_or_kms_use() -> None:
    ca = make_ca()
    p256 = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(InvalidInputError, match="subject alternative"):
        await ca.issue(make_csr(p256, dns_san=True), node_id="n-1")
    with pytest.raises(InvalidInputError, match="key must be"):
        weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505
        await ca.issue(make_csr(weak), node_id="n-1")
    with pytest.raises(InvalidInputError, match="too large"):
        await ca.issue("A" * 20_000, node_id="n-1")
    with pytest.raises(InvalidInputError) as caught:
        await ca.issue(make_csr(p256), node_id="n-1", role="ramdisk", ttl=dt.timedelta(hours=3))
    assert caught.value.details == {"field": "ttl", "max_seconds": 7200, "role": "ramdisk"}
    assert caught.value.code == "INVALID_INPUT"
