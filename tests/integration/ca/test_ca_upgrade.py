"""A trust domain whose node CA was one flat key (before the root and its intermediates) upgrades in place: the flat
key stays trusted as a previous root, the next start makes a root and its first intermediate, certificates the flat
key issued still verify, and the flat key retires only once they have expired."""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from cryptography.x509.verification import PolicyBuilder, Store

from bettercompute import LocalKeyKms
from bettercompute.errors import FailedPreconditionError
from bettercompute.modules.nodes import CertificateAuthority
from bettercompute.testing import ManualClock
from bettercompute_store_pg import PgStore
from bettercompute_store_pg.modules.nodes._migrations import MIGRATIONS as NODES_MIGRATIONS

from .test_ca import csr, verify

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

TD = "upgrade.example.test"
NOW = dt.datetime(2030, 1, 1, 12, tzinfo=dt.UTC)


def _flat_ca(key: ec.EllipticCurvePrivateKey, key_id: str) -> x509.Certificate:
    """A CA certificate as the flat node CA made them: self-signed, path length 0, signing leaves itself."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"flat {key_id}")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(days=1))
        .not_valid_after(NOW + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _flat_leaf(issuer: x509.Certificate, key: ec.EllipticCurvePrivateKey, node_id: str) -> x509.Certificate:
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
        .issuer_name(issuer.subject)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(minutes=1))
        .not_valid_after(NOW + dt.timedelta(hours=24))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"spiffe://{TD}/node/{node_id}")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


async def test_a_flat_ca_key_becomes_a_previous_root_and_retires_once_what_it_issued_expired(
    database_url: str, empty_schema: str, tmp_path: Path
) -> None:
    kms = LocalKeyKms(tmp_path / "kms.key")
    clock = ManualClock(NOW)
    key_id = f"cak_{secrets.token_hex(8)}"
    flat_key = ec.generate_private_key(ec.SECP256R1())
    flat = _flat_ca(flat_key, key_id)
    leaf = _flat_leaf(flat, flat_key, "n-old")
    sealed = await kms.encrypt(
        flat_key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        context=f"ca:{TD}:{key_id}",
    )
    async with PgStore(database_url, schema=empty_schema, pool_size=2) as store:
        await store.install()
        await store.migrate("pools", store.migrations("pools"))
        assert await store.migrate("nodes", [m for m in NODES_MIGRATIONS if m.version <= 13]) == list(range(1, 14))
        with psycopg.connect(database_url, autocommit=True) as conn:
            s = f'"{empty_schema}"'
            conn.execute(
                f"INSERT INTO {s}.ca_keys (id, trust_domain, algorithm, sealed_key, certificate_pem, state, not_after)"
                " VALUES (%s, %s, 'ecdsa-p256-sha256', %s, %s, 'active', %s)",
                (key_id, TD, sealed, flat.public_bytes(serialization.Encoding.PEM).decode(), flat.not_valid_after_utc),
            )
            conn.execute(
                f"INSERT INTO {s}.certificates (serial, node_id, spiffe_id, role, ca_key_id, not_before, not_after)"
                " VALUES (%s, 'n-old', %s, 'node', %s, %s, %s)",
                (
                    format(leaf.serial_number, "x"),
                    f"spiffe://{TD}/node/n-old",
                    key_id,
                    leaf.not_valid_before_utc,
                    leaf.not_valid_after_utc,
                ),
            )
        assert await store.migrate("nodes", store.migrations("nodes")) == [14, 15]

        ca = CertificateAuthority(store, kms, trust_domain=TD, clock=clock)
        intermediate = await ca.ensure()
        keys = await ca.keys()
        assert [(k.id == key_id, k.is_root, k.state) for k in keys] == [
            (True, True, "previous"),
            (False, True, "active"),
            (False, False, "active"),
        ]
        assert intermediate.issuer_id == keys[1].id
        # Both roots are trusted: what the flat key issued verifies, and so does what the intermediate issues.
        bundle = await ca.trust_bundle()
        assert len(bundle) == 2
        old_pem = leaf.public_bytes(serialization.Encoding.PEM).decode()
        assert verify(bundle, old_pem, NOW)
        issued = await ca.issue(csr(), node_id="n-new")
        assert verify(bundle, issued.certificate_pem + issued.chain_pem, NOW)
        # The instruction key's certificate still comes from the oldest root every daemon pinned: the flat key.
        signer, _ = await ca.certify_signer(ec.generate_private_key(ec.SECP256R1()).public_key(), key_id="sgk_1")
        x509.load_der_x509_certificate(signer).verify_directly_issued_by(flat)
        # The flat key retires once what it issued has expired, and then leaves the bundle.
        with pytest.raises(FailedPreconditionError):
            await ca.retire(key_id)
        clock.advance(dt.timedelta(hours=25))
        await ca.retire(key_id)
        assert [c.subject for c in await ca.trust_bundle()] == [
            x509.load_pem_x509_certificate(keys[1].certificate_pem.encode()).subject
        ]
        verifier = PolicyBuilder().store(Store(await ca.trust_bundle())).time(NOW).build_client_verifier()
        with pytest.raises(x509.verification.VerificationError):
            verifier.verify(leaf, [])
