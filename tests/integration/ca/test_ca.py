"""The node CA against PostgreSQL: issuing, chains, refusals, revocation events, rotation, and no key in the clear."""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from bettercompute import LocalKeyKms
from bettercompute.errors import FailedPreconditionError, InvalidInputError, NotFoundError, UnavailableError
from bettercompute.modules.nodes import CERTIFICATES, CertificateAuthority, serial_hex
from bettercompute.testing import GuardedKms, ManualClock
from bettercompute_store_pg import PgStore
from tests._timing import deadline

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

TD = "compute.example.test"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(dt.datetime(2030, 1, 1, 12, tzinfo=dt.UTC))


@pytest.fixture
async def ca(pg_store: PgStore, tmp_path: Path, clock: ManualClock) -> AsyncIterator[CertificateAuthority]:
    # The KMS double fails any call made while a transaction is open: the CA seals and opens keys outside them.
    kms = GuardedKms(LocalKeyKms(tmp_path / "kms.key"))
    yield CertificateAuthority(pg_store, kms, trust_domain=TD, clock=clock)


def csr(key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey | None = None, *, san: bool = False) -> str:
    key = key or ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "whatever-the-node-says")])
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"spiffe://{TD}/site/admin")]),
            critical=False,
        )
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm).public_bytes(serialization.Encoding.PEM).decode()


def verify(bundle: list[x509.Certificate], pem: str, at: dt.datetime) -> list[x509.GeneralName]:
    """The subjects of the first certificate in ``pem``, verified with the rest as its chain."""
    leaf, *chain = x509.load_pem_x509_certificates(pem.encode())
    verifier = PolicyBuilder().store(Store(bundle)).time(at).build_client_verifier()
    verified = verifier.verify(leaf, chain)
    assert verified.subjects is not None
    return list(verified.subjects)


async def test_issued_certificate_chains_to_the_bundle_with_exactly_its_spiffe_id(
    ca: CertificateAuthority, pg_store: PgStore, clock: ManualClock
) -> None:
    issued = await ca.issue(csr(), node_id="n-1", role="node")
    assert issued.spiffe_id == f"spiffe://{TD}/node/n-1"
    bundle = await ca.trust_bundle()
    assert len(bundle) == 1
    full = issued.certificate_pem + issued.chain_pem
    assert verify(bundle, full, clock.now()) == [x509.UniformResourceIdentifier(issued.spiffe_id)]
    with pytest.raises(VerificationError):  # the root signs only intermediates: a leaf needs its chain
        verify(bundle, issued.certificate_pem, clock.now())
    intermediate = x509.load_pem_x509_certificate(issued.chain_pem.encode())
    assert intermediate.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    assert bundle[0].extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 1
    intermediate.verify_directly_issued_by(bundle[0])
    cert = x509.load_pem_x509_certificate(issued.certificate_pem.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert list(san) == [x509.UniformResourceIdentifier(f"spiffe://{TD}/node/n-1")]
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "node"
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "n-1"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == dt.timedelta(hours=24)
    assert issued.chain_pem == intermediate.public_bytes(serialization.Encoding.PEM).decode()
    assert issued.chain_pem != bundle[0].public_bytes(serialization.Encoding.PEM).decode()
    record = await pg_store.repository(CERTIFICATES).get(issued.serial)
    assert record is not None
    assert (record.node_id, record.spiffe_id, record.role, record.ca_key_id) == (
        "n-1",
        issued.spiffe_id,
        "node",
        issued.ca_key_id,
    )
    assert record.serial == serial_hex(cert.serial_number)
    assert (record.not_before, record.not_after) == (cert.not_valid_before_utc, cert.not_valid_after_utc)
    # An expired certificate no longer verifies.
    with pytest.raises(VerificationError):
        verify(bundle, issued.certificate_pem, clock.now() + dt.timedelta(hours=25))


async def test_roles_paths_and_key_types(ca: CertificateAuthority, clock: ManualClock) -> None:
    site = await ca.issue(csr(ed25519.Ed25519PrivateKey.generate()), node_id="site-a", role="site")
    ramdisk = await ca.issue(csr(), node_id="n-2", role="ramdisk")
    assert site.spiffe_id == f"spiffe://{TD}/site/site-a"
    assert ramdisk.spiffe_id == f"spiffe://{TD}/ramdisk/n-2"
    assert ramdisk.not_after - ramdisk.not_before == dt.timedelta(hours=2)
    bundle = await ca.trust_bundle()
    full = ramdisk.certificate_pem + ramdisk.chain_pem
    assert verify(bundle, full, clock.now()) == [x509.UniformResourceIdentifier(ramdisk.spiffe_id)]
    cert = x509.load_pem_x509_certificate(site.certificate_pem.encode())
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "site"


async def test_bad_csrs_and_ttls_are_invalid_input(ca: CertificateAuthority, pg_store: PgStore) -> None:
    # A CSR whose signature is not by its own key: sign with one key, then swap in another's public key.
    good = x509.load_pem_x509_csr(csr().encode())
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    der = bytearray(good.public_bytes(serialization.Encoding.DER))
    old_spki = good.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    new_spki = other.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert len(old_spki) == len(new_spki)
    at = bytes(der).index(old_spki)
    der[at : at + len(old_spki)] = new_spki
    forged = "-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(bytes(der)).decode()
    forged += "-----END CERTIFICATE REQUEST-----\n"
    with pytest.raises(InvalidInputError) as caught:
        await ca.issue(forged, node_id="n-1")
    assert caught.value.details["reason"] == "signature"

    with pytest.raises(InvalidInputError) as caught:
        await ca.issue(csr(san=True), node_id="n-1")
    assert caught.value.details["reason"] == "san"

    with pytest.raises(InvalidInputError):
        await ca.issue("not a csr", node_id="n-1")
    with pytest.raises(InvalidInputError) as caught:
        await ca.issue(csr(), node_id="n-1", role="ramdisk", ttl=dt.timedelta(hours=2, seconds=1))
    assert caught.value.details["field"] == "ttl"
    with pytest.raises(InvalidInputError):
        await ca.issue(csr(), node_id="n-1", ttl=dt.timedelta(hours=25))
    with pytest.raises(InvalidInputError):
        await ca.issue(csr(), node_id="n-1", ttl=dt.timedelta(0))
    with pytest.raises(InvalidInputError):
        await ca.issue(csr(), node_id="n-1", role="admin")
    with pytest.raises(InvalidInputError):
        await ca.issue(csr(), node_id="../etc")
    with pytest.raises(InvalidInputError):
        await ca.issue(csr(ec.generate_private_key(ec.SECP256K1())), node_id="n-1")
    rows = await pg_store.fetch(pg_store.sql("SELECT count(*) AS n FROM {s}.certificates"), {})
    assert rows[0].n == 0


async def outbox(store: PgStore) -> list[tuple[str, str, dict[str, object]]]:
    rows = await store.fetch(store.sql("SELECT type, key, payload FROM {s}.outbox ORDER BY id"), {})
    return [(r.type, r.key, r.payload) for r in rows]


async def test_revocation_by_serial_and_by_spiffe_id_is_recorded_and_published(
    ca: CertificateAuthority, pg_store: PgStore
) -> None:
    a1 = await ca.issue(csr(), node_id="a")
    a2 = await ca.issue(csr(), node_id="a")
    b1 = await ca.issue(csr(), node_id="b")
    assert not await ca.is_revoked(a1.serial)

    result = await ca.revoke(int(b1.serial, 16), reason="stolen")
    assert result.serials == (b1.serial,)
    assert await ca.is_revoked(b1.serial)
    assert await ca.is_revoked(b1.serial.upper())
    again = await ca.revoke(b1.serial, reason="stolen")
    assert again.serials == ()

    result = await ca.revoke_spiffe_id(a1.spiffe_id, reason="reclaimed")
    assert sorted(result.serials) == sorted([a1.serial, a2.serial])
    assert await ca.is_revoked(a1.serial) and await ca.is_revoked(a2.serial)
    assert len(await pg_store.repository(CERTIFICATES).revocations(a1.spiffe_id)) == 2

    events = await outbox(pg_store)
    assert events == [
        ("certificate.revoked", b1.spiffe_id, {"spiffe_id": b1.spiffe_id, "serials": [b1.serial], "reason": "stolen"}),
        (
            "certificate.revoked",
            a1.spiffe_id,
            {"spiffe_id": a1.spiffe_id, "serials": sorted([a1.serial, a2.serial]), "reason": "reclaimed"},
        ),
    ]
    with pytest.raises(NotFoundError):
        await ca.revoke("abcdef")
    with pytest.raises(InvalidInputError):
        await ca.revoke("not-hex")
    with pytest.raises(InvalidInputError):
        await ca.revoke_spiffe_id("spiffe://elsewhere.test/node/a")


async def test_revocation_rolls_back_with_its_transaction(ca: CertificateAuthority, pg_store: PgStore) -> None:
    issued = await ca.issue(csr(), node_id="a")

    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        async with pg_store.transaction() as tx:
            await ca.revoke_in(tx, issued.serial)
            raise Abort
    assert not await ca.is_revoked(issued.serial)
    assert await outbox(pg_store) == []


async def test_rotation_keeps_old_certificates_valid_until_retire(
    ca: CertificateAuthority, pg_store: PgStore, clock: ManualClock
) -> None:
    old = await ca.issue(csr(), node_id="n-1")
    pin = await ca.trust_bundle_pem()
    new_key = await ca.rotate()
    assert new_key.id != old.ca_key_id and new_key.issuer_id is not None
    new = await ca.issue(csr(), node_id="n-1")
    assert new.ca_key_id == new_key.id and new.chain_pem != old.chain_pem
    # The rotation made an intermediate under the same root: the bundle (what join tokens pin) did not change.
    assert await ca.trust_bundle_pem() == pin
    bundle = await ca.trust_bundle()
    assert len(bundle) == 1
    for issued in (old, new):
        full = issued.certificate_pem + issued.chain_pem
        assert verify(bundle, full, clock.now()) == [x509.UniformResourceIdentifier(issued.spiffe_id)]

    root = next(k for k in await ca.keys() if k.is_root)
    with pytest.raises(FailedPreconditionError):
        await ca.retire(new_key.id)  # the active intermediate
    with pytest.raises(FailedPreconditionError, match="pins"):
        await ca.retire(root.id)  # the root, ever
    with pytest.raises(FailedPreconditionError):
        await ca.retire(old.ca_key_id)  # its certificate is still valid
    with pytest.raises(NotFoundError):
        await ca.retire("cak_nope")

    clock.advance(dt.timedelta(hours=25))
    await ca.retire(old.ca_key_id)
    assert await ca.trust_bundle_pem() == pin
    assert [x509.load_pem_x509_certificate(new.chain_pem.encode())] == await ca.intermediates()
    with pytest.raises(VerificationError):  # its intermediate is no longer offered as a chain
        verify(
            bundle,
            old.certificate_pem
            + "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in await ca.intermediates()),
            old.not_before + dt.timedelta(hours=1),
        )
    assert [(k.is_root, k.state) for k in await ca.keys()] == [(True, "active"), (False, "retired"), (False, "active")]


async def test_a_forced_retire_revokes_what_the_intermediate_issued_and_a_handshake_alone_would_not(
    ca: CertificateAuthority, pg_store: PgStore, clock: ManualClock
) -> None:
    """TLS checks a chain up to the root, and the root still vouches for a retired intermediate: so retiring one
    early (``force``) revokes its unexpired certificates, which every gateway checks at the handshake and in its
    sessions. Expired ones and those of the new intermediate are left alone."""
    expired = await ca.issue(csr(), node_id="gone", ttl=dt.timedelta(minutes=5))
    clock.advance(dt.timedelta(minutes=10))
    live_a = await ca.issue(csr(), node_id="a")
    live_b = await ca.issue(csr(), node_id="b", role="site")
    old_key = live_a.ca_key_id
    await ca.rotate()
    fresh = await ca.issue(csr(), node_id="a")
    await ca.retire(old_key, force=True)
    assert [await ca.is_revoked(i.serial) for i in (expired, live_a, live_b, fresh)] == [False, True, True, False]
    reason = f"CA key {old_key} retired"
    assert await outbox(pg_store) == [
        ("certificate.revoked", i.spiffe_id, {"spiffe_id": i.spiffe_id, "serials": [i.serial], "reason": reason})
        for i in (live_a, live_b)
    ]
    # The chain still verifies on its own: the revocation is what ends it.
    bundle = await ca.trust_bundle()
    assert verify(bundle, live_a.certificate_pem + live_a.chain_pem, clock.now())
    with pytest.raises(FailedPreconditionError, match="pins"):
        await ca.retire(next(k.id for k in await ca.keys() if k.is_root), force=True)


async def test_a_second_process_sees_one_active_key(pg_store: PgStore, tmp_path: Path, clock: ManualClock) -> None:
    kms = GuardedKms(LocalKeyKms(tmp_path / "kms.key"))
    one = CertificateAuthority(pg_store, kms, trust_domain=TD, clock=clock)
    two = CertificateAuthority(pg_store, kms, trust_domain=TD, clock=clock)
    first, second = await one.ensure(), await two.ensure()
    assert first.id == second.id
    issued = await two.issue(csr(), node_id="n-1")  # decrypts the key the other one sealed
    assert verify(await one.trust_bundle(), issued.certificate_pem + issued.chain_pem, clock.now())


class _RendezvousKms:
    """A test double of the ``Kms`` port: ``encrypt`` returns only once ``parties`` callers are sealing at once, so
    two processes' ``ensure()`` both find no key and race to store theirs (``LocalKeyKms`` does the sealing)."""

    def __init__(self, inner: LocalKeyKms, parties: int) -> None:
        self._inner = inner
        self._parties = parties
        self._arrived = 0
        self._all_here = anyio.Event()
        self.sealed = 0

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        self._arrived += 1
        if self._arrived >= self._parties:
            self._all_here.set()
        with anyio.fail_after(deadline(30)):
            await self._all_here.wait()
        self.sealed += 1
        return await self._inner.encrypt(plaintext, context=context)

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        return await self._inner.decrypt(ciphertext, context=context)


async def test_two_processes_creating_the_first_key_at_once_store_one_and_both_sign_with_it(
    pg_store: PgStore, tmp_path: Path, clock: ManualClock
) -> None:
    rendezvous = _RendezvousKms(LocalKeyKms(tmp_path / "kms.key"), parties=2)
    kms = GuardedKms(rendezvous)  # both seal before their transaction, the loser's key is never stored
    one = CertificateAuthority(pg_store, kms, trust_domain=TD, clock=clock)
    two = CertificateAuthority(pg_store, kms, trust_domain=TD, clock=clock)
    got: dict[str, str] = {}

    async def ensure(name: str, ca: CertificateAuthority) -> None:
        got[name] = (await ca.ensure()).id

    async with anyio.create_task_group() as tg:
        tg.start_soon(ensure, "one", one)
        tg.start_soon(ensure, "two", two)
    assert rendezvous.sealed == 4  # a root and an intermediate each
    keys = await pg_store.repository(CERTIFICATES).keys(TD)
    assert [(k.state, k.is_root) for k in keys] == [("active", True), ("active", False)]
    assert keys[1].id == got["one"] == got["two"]
    bundle = await one.trust_bundle()
    for ca in (one, two):  # the loser signs with the stored key, not with the one it sealed and dropped
        issued = await ca.issue(csr(), node_id="n-1")
        assert issued.ca_key_id == keys[1].id
        assert verify(bundle, issued.certificate_pem + issued.chain_pem, clock.now())


async def test_no_private_key_in_any_table_nor_in_logs(
    ca: CertificateAuthority,
    pg_store: PgStore,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    await ca.issue(csr(), node_id="n-1")
    await ca.rotate()
    await ca.issue(csr(), node_id="n-1", role="ramdisk")
    await ca.revoke_spiffe_id(f"spiffe://{TD}/node/n-1", reason="test")
    secrets: list[bytes] = []
    for key in await ca.keys():
        private = await ca._private_key(key)
        der = private.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        scalar = private.private_numbers().private_value.to_bytes(32, "big")
        body = b"".join(pem.splitlines()[1:-1])
        secrets += [der, scalar, body[:40], base64.b64encode(der)[:40], scalar.hex().encode()]
    assert len(secrets) == 15  # a root and two intermediates

    dump = bytearray()
    with psycopg.connect(database_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (pg_store.schema,)
        ).fetchall()
        assert {"ca_keys", "certificates", "revocations", "outbox"} <= {t[0] for t in tables}
        for (table,) in tables:
            with conn.cursor().copy(f'COPY "{pg_store.schema}"."{table}" TO STDOUT') as copy:
                for chunk in copy:
                    dump += bytes(chunk)
    assert b"cak_" in dump  # the dump did capture the key rows
    logs = "\n".join(r.getMessage() for r in caplog.records).encode()
    for secret in secrets:
        assert secret not in dump
        assert secret.hex().encode() not in dump  # COPY shows bytea as \x<hex>
        assert secret not in logs
    assert b"PRIVATE KEY" not in dump and b"PRIVATE KEY" not in logs


def _server_identity(tmp_path: Path) -> tuple[Path, Path]:
    """A throwaway server certificate for ``localhost`` (its own self-signed CA is not under test)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "server.pem", tmp_path / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


async def test_python_ssl_accepts_an_issued_client_certificate(pg_store: PgStore, tmp_path: Path) -> None:
    import ssl

    ca = CertificateAuthority(pg_store, GuardedKms(LocalKeyKms(tmp_path / "kms.key")), trust_domain=TD)  # real clock
    node_key = ec.generate_private_key(ec.SECP256R1())
    issued = await ca.issue(csr(node_key), node_id="n-1")
    bundle_file = tmp_path / "bundle.pem"
    bundle_file.write_text(await ca.trust_bundle_pem())
    client_cert, client_key = tmp_path / "node.pem", tmp_path / "node.key"
    client_cert.write_text(issued.certificate_pem + issued.chain_pem)
    client_key.write_bytes(
        node_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server_cert, server_key = _server_identity(tmp_path)

    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(bundle_file))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.load_cert_chain(server_cert, server_key)
    client_ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(server_cert))
    client_ctx.load_cert_chain(client_cert, client_key)

    c_in, c_out, s_in, s_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname="localhost")
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(10):
        for side, obj in (("client", client), ("server", server)):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            break
    assert all(done.values())
    client.write(b"ping")  # TLS 1.3: the server sees the client certificate once it reads
    s_in.write(c_out.read())
    assert server.read() == b"ping"
    peer = server.getpeercert()
    assert peer is not None
    assert peer["subjectAltName"] == (("URI", issued.spiffe_id),)


async def test_keys_reused_for_their_ttl_then_read_again(pg_store: PgStore, tmp_path: Path, clock: ManualClock) -> None:
    kms = GuardedKms(LocalKeyKms(tmp_path / "kms.key"))
    now = [0.0]
    cached = CertificateAuthority(
        pg_store, kms, trust_domain=TD, clock=clock, keys_ttl=dt.timedelta(seconds=1), timer=lambda: now[0]
    )
    other = CertificateAuthority(pg_store, kms, trust_domain=TD, clock=clock)  # another process
    first = await cached.prepare()
    root = (await cached.keys())[0]
    assert [k.id for k in await cached.keys()] == [root.id, first.id]  # read, and kept for a second
    rotated = await other.rotate()
    # Within the TTL the keys are the ones read before; a standalone issue still reads the active key afresh.
    assert [k.id for k in await cached.keys()] == [root.id, first.id]
    assert (await cached.issue(csr(), node_id="n-1")).ca_key_id == rotated.id
    now[0] = 1.5
    assert [k.id for k in await cached.keys()] == [root.id, first.id, rotated.id]
    assert len(await cached.trust_bundle()) == 1 and len(await cached.intermediates()) == 2
    # A key this CA changes itself is seen at once.
    newest = await cached.rotate()
    assert [k.id for k in await cached.keys()][-1] == newest.id


async def test_an_issue_in_a_transaction_after_a_rotation_elsewhere_is_refused_then_succeeds(
    pg_store: PgStore, tmp_path: Path, clock: ManualClock
) -> None:
    kms = GuardedKms(LocalKeyKms(tmp_path / "kms.key"))
    cached = CertificateAuthority(pg_store, kms, trust_domain=TD, clock=clock, keys_ttl=dt.timedelta(hours=1))
    other = CertificateAuthority(pg_store, kms, trust_domain=TD, clock=clock)
    await cached.prepare()
    await cached.prepare()  # the keys are now read and kept for the hour
    rotated = await other.rotate()
    with pytest.raises(UnavailableError) as changed:  # the cached key is not the active one any more
        async with pg_store.transaction() as tx:
            await cached.issue_in(tx, csr(), node_id="n-1")
    assert changed.value.details["reason"] == "ca_key_changed"
    await cached.prepare()  # the retry reads the keys again, despite the hour-long TTL
    async with pg_store.transaction() as tx:
        assert (await cached.issue_in(tx, csr(), node_id="n-1")).ca_key_id == rotated.id


async def test_a_gateway_server_certificate_names_its_hosts_and_serves_only(
    ca: CertificateAuthority, pg_store: PgStore
) -> None:
    issued = await ca.issue_server(csr(), name="gw-1", hosts=["gw.eu-1.example.com", "10.0.0.7", "::1"])
    cert = x509.load_pem_x509_certificate(issued.certificate_pem.encode())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.UniformResourceIdentifier) == [f"spiffe://{ca.trust_domain}/gateway/gw-1"]
    assert names.get_values_for_type(x509.DNSName) == ["gw.eu-1.example.com"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.7", "::1"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    # A gateway also dials the api process's internal channel as a client; its SPIFFE role (gateway, not node)
    # is what keeps it from opening a node session.
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    listener = await ca.issue_server(csr(), name="api-1", hosts=["127.0.0.1"], role="control")
    listener_cert = x509.load_pem_x509_certificate(listener.certificate_pem.encode())
    listener_names = listener_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert listener_names.get_values_for_type(x509.UniformResourceIdentifier) == [
        f"spiffe://{ca.trust_domain}/control/api-1"
    ]
    listener_usage = listener_cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(listener_usage) == [ExtendedKeyUsageOID.SERVER_AUTH]  # the listener never dials anything
    assert (await pg_store.repository(CERTIFICATES).get(issued.serial)) is not None
    for hosts in ([], ["under_score.example"], ["bücher.example"], ["-x.example"], ["a" * 64 + ".example"]):
        with pytest.raises(InvalidInputError):
            await ca.issue_server(csr(), name="gw-1", hosts=hosts)
    with pytest.raises(InvalidInputError):
        await ca.issue_server(csr(), name="gw/1", hosts=["gw.example"])
