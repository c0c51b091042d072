"""``CertificateAuthority``: the node CA of one trust domain (DESIGN §7, issue 5 item 4).

Keys. ECDSA P-256 with SHA-256: what every TLS stack (Python ``ssl``/OpenSSL, grpclib, Go, browsers) verifies, and
what ``cryptography``'s web-PKI verifier accepts; Ed25519 CA signatures are still refused by several TLS libraries.
A key is generated once, sealed by the KMS (context ``ca:<trust-domain>:<key-id>``) as PKCS#8 DER and stored in
``ca_keys`` with its certificate; its plaintext exists only in this process's memory.

Two tiers. A root (self-signed, 10 years, path length 1) is what the trust bundle carries, what a join token pins and
what a daemon keeps as its instruction anchor; it signs only intermediates and the instruction keys' certificates. An
intermediate (certified by the root, path length 0) signs every leaf, and is sent as the chain beside each one.

Rotation overlaps: ``rotate()`` makes a new active intermediate under the same root and turns the old one
``previous``; certificates it issued keep verifying (their chain still ends at the root), and ``retire(old)`` is
refused while any is unexpired and unrevoked (unless forced). The root does not rotate here, so the pin in join
tokens, install scripts and daemons survives every rotation. Keys from before the two tiers (a flat key that
signed leaves itself) stay in the bundle as ``previous`` roots until retired.

Issued certificates (X.509-SVID style):

- Subject ``CN=<node-id>, OU=<role>, O=Better Compute``; the role is the OU (no private OID needed).
- Exactly one SAN, a URI: ``spiffe://<trust-domain>/<role>/<node-id>`` (``/node/…``, ``/site/…``, ``/ramdisk/…``),
  so the role is also part of the identity a gateway authorizes on. A CSR asking for any SAN is refused.
- ``basicConstraints CA:FALSE`` (critical), ``keyUsage digitalSignature`` (critical), ``extendedKeyUsage
  clientAuth``, subject and authority key identifiers.
- Lifetime ``ttl`` (24 h by default, at most ``max_ttl``; ramdisk: 2 h by default and at most 2 h). ``notBefore`` is
  backdated by ``CLOCK_SKEW`` for slow clocks and ``notAfter = notBefore + ttl``: a certificate never lives longer
  than it was asked to.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import secrets
import time
from collections.abc import Callable, Sequence

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bettercompute.errors import (
    FailedPreconditionError,
    InvalidConfigError,
    InvalidInputError,
    NotFoundError,
    UnavailableError,
)
from bettercompute.modules.nodes._port import CERTIFICATES, CaKey, Certificates, IssuedCertificate, Revocation
from bettercompute.modules.nodes._x509 import (
    AcceptedKey,
    Leaf,
    checked_csr_key,
    checked_segment,
    host_name,
    key_sha256,
    serial_hex,
    sign_leaf,
    unsealed_ec_key,
    utc_seconds,
)
from bettercompute.ports import Clock, Kms, OutboxEvent, Store, Transaction

__all__ = [
    "CertificateAuthority",
    "IssuedBundle",
    "RevocationResult",
    "ca_key_context",
    "trust_bundle_pem_of",
    "trusted_roots",
]

log = logging.getLogger("bettercompute.ca")

ROLES = ("node", "site", "ramdisk")
"""The roles a certificate can carry; each is also the first path segment of its SPIFFE ID."""

GATEWAY_ROLE = "gateway"
"""The role of a gateway's certificate (``issue_server``): its server certificate towards daemons and its client
certificate on the internal channel to the api process; never one a node's certificate can have."""
CONTROL_ROLE = "control"
"""The role of the api process's internal listener's server certificate (``issue_server``): what a gateway checks
before it trusts the listener, so that no gateway certificate can stand in for it."""
SERVER_ROLES = (GATEWAY_ROLE, CONTROL_ROLE)
SIGNER_ROLE = "signer"
"""The role of an instruction-signing key's certificate (``certify_signer``): ``spiffe://<trust-domain>/signer/<id>``,
code signing only, so it is never a TLS peer; a daemon trusts an instruction only under such a certificate."""

RAMDISK_MAX_TTL = dt.timedelta(hours=2)
DEFAULT_TTL = dt.timedelta(hours=24)
CLOCK_SKEW = dt.timedelta(minutes=1)
"""How far ``notBefore`` is backdated, for verifiers whose clock is a little behind."""

REVOKED_EVENT = "certificate.revoked"

_ALGORITHM = "ecdsa-p256-sha256"
_ORG = "Better Compute"
# SPIFFE: a trust domain is lower-case letters, digits, '.', '-' and '_'; a path segment adds upper case.
_TRUST_DOMAIN = re.compile(r"[a-z0-9._-]{1,255}")
_NODE_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_MAX_CSR_BYTES = 16 * 1024


def ca_key_context(trust_domain: str, key_id: str) -> str:
    """The KMS context a CA key's private half is sealed under."""
    return f"ca:{trust_domain}:{key_id}"


def trusted_roots(keys: Sequence[CaKey]) -> list[CaKey]:
    """What the trust bundle holds among ``keys``: every root not retired, in their order."""
    return [k for k in keys if k.state != "retired" and k.is_root]


def trust_bundle_pem_of(keys: Sequence[CaKey]) -> str:
    """The trust bundle of ``keys`` as PEM (what a join token's pin is the hash of); empty when there is none."""
    return "".join(k.certificate_pem for k in trusted_roots(keys))


def _active_of(keys: Sequence[CaKey], *, root: bool) -> CaKey | None:
    """The active root (``root``) or the active intermediate among ``keys``."""
    return next((k for k in keys if k.state == "active" and k.is_root == root), None)


class _SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


@attrs.frozen(kw_only=True)
class IssuedBundle:
    """What ``issue`` returns: the leaf as PEM, the chain to send with it (the issuing CA certificate), and facts."""

    certificate_pem: str
    chain_pem: str
    serial: str
    spiffe_id: str
    role: str
    ca_key_id: str
    not_before: dt.datetime
    not_after: dt.datetime


@attrs.frozen(kw_only=True)
class RevocationResult:
    """What a revocation added: the serials newly revoked (empty when they all were revoked already)."""

    spiffe_id: str
    serials: tuple[str, ...]


class CertificateAuthority:
    """The node CA of ``trust_domain``: keys behind the KMS, issuing, revocation and an overlapping trust bundle.

    Nothing is read or written before the first call. Several processes may share one trust domain: key changes are
    serialized by the store's per-trust-domain lock, and every process reads the active key from the store, so a
    rotation elsewhere is picked up at the next ``issue``.

    Args:
        store: Where keys, issued certificates and revocations live (``Store.certificates``).
        kms: Seals the CA's private keys.
        trust_domain: The SPIFFE trust domain (``compute.example.com``).
        clock: Time source (tests inject one); the system clock by default.
        ca_validity: How long a new CA certificate is valid (10 years by default).
        max_ttl: The longest lifetime of a ``node`` or ``site`` certificate (24 h by default).
        keys_ttl: How long keys read outside a transaction (``keys``, ``trust_bundle``, the active key ``prepare``
            loads) are reused before being read again; zero (the default) reads them every time. JoinService uses a
            second: a join reads them once instead of three times, and a key another process rotated in shows in
            this process's bundle at most that late. ``issue(tx=...)`` always reads the active key in its own
            transaction, so it never signs with a key the cache still holds after a rotation.
        timer: Seconds of a monotonic clock, for ``keys_ttl`` (tests inject one).

    Raises:
        InvalidConfigError: a malformed trust domain or non-positive durations.
    """

    def __init__(
        self,
        store: Store,
        kms: Kms,
        *,
        trust_domain: str,
        clock: Clock | None = None,
        ca_validity: dt.timedelta = dt.timedelta(days=3650),
        max_ttl: dt.timedelta = DEFAULT_TTL,
        keys_ttl: dt.timedelta = dt.timedelta(0),
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if not _TRUST_DOMAIN.fullmatch(trust_domain):
            raise InvalidConfigError(
                "the trust domain must be lower-case letters, digits, '.', '-' and '_'",
                details={"problems": [{"path": "trust_domain"}]},
            )
        if ca_validity <= dt.timedelta(0) or max_ttl <= dt.timedelta(0):
            raise InvalidConfigError("CA durations must be positive", details={"problems": [{"path": "max_ttl"}]})
        self._store = store
        self._kms = kms
        self.trust_domain = trust_domain
        self._clock: Clock = clock or _SystemClock()
        self._ca_validity = ca_validity
        self._max_ttl = max_ttl
        self._private: dict[str, ec.EllipticCurvePrivateKey] = {}
        self._keys_ttl = keys_ttl.total_seconds()
        self._timer = timer
        self._read: tuple[float, list[CaKey]] | None = None  # (when, keys) of the last read outside a transaction
        self._generation = 0  # bumped by each change this process makes to the keys
        self._bundle: tuple[tuple[str, ...], list[x509.Certificate]] | None = None
        self._ca_certs: dict[str, x509.Certificate] = {}  # each key's CA certificate, parsed (keys never change)

    ROLES = ROLES
    RAMDISK_MAX_TTL = RAMDISK_MAX_TTL
    DEFAULT_TTL = DEFAULT_TTL
    CLOCK_SKEW = CLOCK_SKEW
    REVOKED_EVENT = REVOKED_EVENT

    def __repr__(self) -> str:
        return f"CertificateAuthority(trust_domain={self.trust_domain!r})"

    # --- identity -----------------------------------------------------------------------------------------------

    def spiffe_id(self, node_id: str, role: str = "node") -> str:
        """``spiffe://<trust-domain>/<role>/<node-id>``.

        Raises:
            InvalidInputError: an unknown role or a node id that is not a SPIFFE path segment.
        """
        if role not in ROLES:
            raise InvalidInputError(
                f"the role must be one of {', '.join(ROLES)}", details={"field": "role", "allowed": list(ROLES)}
            )
        if not _NODE_ID.fullmatch(node_id) or node_id in (".", ".."):
            raise InvalidInputError(
                "a node id is 1 to 128 letters, digits, '.', '-' or '_'", details={"field": "node_id"}
            )
        return f"spiffe://{self.trust_domain}/{role}/{node_id}"

    # --- keys ---------------------------------------------------------------------------------------------------

    async def ensure(self) -> CaKey:
        """The active intermediate, created (once, whichever process comes first) with a root when the trust domain
        has none."""
        for _ in range(3):
            keys = await self.keys()
            active = _active_of(keys, root=False)
            if active is not None:
                return active
            root = _active_of(keys, root=True)
            # Sealed and signed before the transaction: the KMS may be remote, and no network call waits inside one.
            if root is None:
                root, root_private = await self._sealed_key(issuer=None)
                new_root: CaKey | None = root
            else:
                root_private, new_root = await self._private_key(root), None
            made, private = await self._sealed_key(issuer=(root, root_private))
            async with self._store.transaction() as tx:
                await tx.repository(CERTIFICATES).lock(self.trust_domain)
                current = await tx.repository(CERTIFICATES).keys(self.trust_domain)
                current_root, winner = _active_of(current, root=True), _active_of(current, root=False)
                if winner is None and new_root is not None and current_root is None:
                    await tx.repository(CERTIFICATES).add_key(new_root)
                    await tx.repository(CERTIFICATES).add_key(made)
                    winner = made
                elif winner is None and new_root is None and current_root is not None and current_root.id == root.id:
                    await tx.repository(CERTIFICATES).add_key(made)
                    winner = made
                # Otherwise another process made a root meanwhile: ours is dropped and the next round uses theirs.
            self._forget_keys()
            if winner is made:
                if new_root is not None:
                    self._created(new_root, root_private)
                return self._created(made, private)
            if winner is not None:
                return winner  # another process created it meanwhile: ours, never stored, is dropped
        raise self._key_changed()

    async def prepare(self) -> CaKey:
        """``ensure()``, and load the active intermediate's private half from the KMS into this process.

        Call it before a transaction that issues: ``issue(tx=...)`` never calls the KMS (a remote KMS would be
        network I/O inside the transaction) and refuses, retryably, when the key it needs is not loaded.
        """
        key = await self.ensure()
        await self._private_key(key)
        return key

    async def rotate(self) -> CaKey:
        """Make a new active intermediate under the active root; the current one becomes ``previous`` (what it issued
        keeps verifying until it is retired).

        Raises:
            UnavailableError: the root changed while the new intermediate was made (``ca_key_changed``; retry).
        """
        await self.ensure()
        root = _active_of(await self._store.repository(CERTIFICATES).keys(self.trust_domain), root=True)
        if root is None:
            raise self._key_changed()
        made, private = await self._sealed_key(issuer=(root, await self._private_key(root)))  # before the transaction
        async with self._store.transaction() as tx:
            await tx.repository(CERTIFICATES).lock(self.trust_domain)
            keys = await tx.repository(CERTIFICATES).keys(self.trust_domain)
            current_root = _active_of(keys, root=True)
            if current_root is None or current_root.id != root.id:
                raise self._key_changed()
            old = _active_of(keys, root=False)
            if old is not None:
                await tx.repository(CERTIFICATES).set_key_state(
                    trust_domain=self.trust_domain, id=old.id, state="previous"
                )
            await tx.repository(CERTIFICATES).add_key(made)
        self._forget_keys()
        return self._created(made, private)

    async def retire(self, key_id: str, *, force: bool = False) -> None:
        """Stop trusting a ``previous`` key: an intermediate's certificates verify no more, and a root leaves the
        trust bundle.

        Raises:
            NotFoundError: the trust domain has no such key.
            FailedPreconditionError: the key is an active one, or (without ``force``) certificates it issued are
                still unexpired and unrevoked, or (a root) an intermediate it certified is still trusted.
        """
        async with self._store.transaction() as tx:
            await tx.repository(CERTIFICATES).lock(self.trust_domain)
            keys = {k.id: k for k in await tx.repository(CERTIFICATES).keys(self.trust_domain)}
            key = keys.get(key_id)
            if key is None:
                raise NotFoundError("no such CA key", details={"key_id": key_id})
            if key.state == "retired":
                return
            if key.state == "active" and key.is_root:
                raise FailedPreconditionError(
                    "the active root CA key cannot be retired: every daemon pins it", details={"key_id": key_id}
                )
            if key.state == "active":
                raise FailedPreconditionError(
                    "the active CA key cannot be retired; rotate first", details={"key_id": key_id}
                )
            children = [k.id for k in keys.values() if k.issuer_id == key_id and k.state != "retired"]
            if children and not force:
                raise FailedPreconditionError(
                    "intermediates this root certified are still trusted; retire them first",
                    details={"key_id": key_id, "intermediates": children},
                )
            live = await tx.repository(CERTIFICATES).live_count(key_id, now=self._clock.now())
            if live and not force:
                raise FailedPreconditionError(
                    "certificates issued under this CA key are still valid; retire it after they expire",
                    details={"key_id": key_id, "live_certificates": live},
                )
            retiring = [key_id, *children]
            for each in retiring:
                await tx.repository(CERTIFICATES).set_key_state(
                    trust_domain=self.trust_domain, id=each, state="retired"
                )
            # Forced: what the retired keys issued is revoked too, so that no TLS handshake keeps accepting it (a
            # handshake checks the chain up to the root, which still trusts a retired intermediate's signature).
            revoked = await tx.repository(CERTIFICATES).revoke_issued_by(
                retiring, now=self._clock.now(), reason=f"CA key {key_id} retired"
            )
            await self._publish_revoked(tx, revoked)
        self._private.pop(key_id, None)
        self._forget_keys()
        log.info("CA key %s of %s retired", key_id, self.trust_domain)

    async def keys(self) -> list[CaKey]:
        """Every key of the trust domain (sealed), oldest first (reused for ``keys_ttl``)."""
        read = self._read
        if read is not None and self._timer() - read[0] < self._keys_ttl:
            return list(read[1])
        generation = self._generation
        keys = await self._store.repository(CERTIFICATES).keys(self.trust_domain)
        if generation == self._generation:  # not kept if this process changed the keys meanwhile
            self._read = (self._timer(), keys)
        return list(keys)

    def _forget_keys(self) -> None:
        """Drop the keys read outside a transaction (this process changed them)."""
        self._read = None
        self._generation += 1

    async def trust_bundle(self) -> list[x509.Certificate]:
        """The CA certificates to trust: every root not retired, oldest first (creating the first keys if needed).
        Intermediates are not in it: each leaf comes with its own (``IssuedBundle.chain_pem``)."""
        await self.ensure()
        trusted = trusted_roots(await self.keys())
        ids = tuple(k.id for k in trusted)
        if self._bundle is None or self._bundle[0] != ids:
            self._bundle = (ids, [x509.load_pem_x509_certificate(k.certificate_pem.encode()) for k in trusted])
        return list(self._bundle[1])

    async def trust_bundle_pem(self) -> str:
        """``trust_bundle`` as concatenated PEM (a ``cafile`` for ``ssl``)."""
        bundle = await self.trust_bundle()
        return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in bundle)

    async def intermediates(self) -> list[x509.Certificate]:
        """The intermediates still trusted (a verifier's untrusted chain candidates for a bare leaf), oldest first."""
        return [self._certificate_of(k) for k in await self.keys() if k.state != "retired" and not k.is_root]

    # --- issuing ------------------------------------------------------------------------------------------------

    async def issue(
        self,
        csr_pem: str | bytes,
        *,
        node_id: str,
        role: str = "node",
        ttl: dt.timedelta | None = None,
        checked_key: AcceptedKey | None = None,
    ) -> IssuedBundle:
        """Sign a CSR for ``node_id`` in ``role`` and record the certificate, in a transaction of its own (loading
        the active key from the KMS first if needed). ``issue_in`` records it in the caller's transaction.

        Only the CSR's public key is used: the subject, SAN and extensions are the CA's own. A caller that checked
        the CSR already passes the key ``checked_csr_key(csr_pem)`` returned as ``checked_key`` (it is not parsed
        twice).

        Raises:
            InvalidInputError: a CSR that does not parse, whose signature does not match its key, whose key type is
                not accepted (EC P-256/P-384, Ed25519, RSA >= 2048), or that asks for a subject alternative name;
                an unknown role, a bad node id, a ttl that is not positive or is longer than the role allows.
        """
        return await self._issue(None, csr_pem, node_id=node_id, role=role, ttl=ttl, checked_key=checked_key)

    async def issue_in(
        self,
        tx: Transaction,
        csr_pem: str | bytes,
        *,
        node_id: str,
        role: str = "node",
        ttl: dt.timedelta | None = None,
        checked_key: AcceptedKey | None = None,
    ) -> IssuedBundle:
        """``issue``, recorded in ``tx`` (a join's writes and the record commit together).

        Nothing is read and nothing called out before the record: the key is the active one ``prepare()`` (call it
        before the transaction) read and loaded, and the record is made only if that key is still the active one
        (checked by its statement); if another process rotated meanwhile, or the key is not loaded,
        ``UnavailableError`` (``ca_key_changed``) and the retry reads the keys again. Raises as ``issue`` otherwise.
        """
        return await self._issue(tx, csr_pem, node_id=node_id, role=role, ttl=ttl, checked_key=checked_key)

    async def issue_server(
        self,
        csr_pem: str | bytes,
        *,
        name: str,
        hosts: Sequence[str],
        ttl: dt.timedelta | None = None,
        role: str = GATEWAY_ROLE,
    ) -> IssuedBundle:
        """A server certificate for the gateway ``name``, valid for ``hosts`` (DNS names or IP addresses a daemon
        dials), from the same CA as the nodes' certificates: a daemon that trusts the bundle it joined with trusts
        it. Role ``gateway`` (``spiffe://<trust-domain>/gateway/<name>``, extended key usage server and client
        authentication: the client side is for the internal channel, and no node role means it cannot open a
        session as a node), recorded and revocable like the others; 24 hours by default. Role ``control`` is the
        api process's internal listener (server authentication only).

        Raises:
            InvalidInputError: a bad CSR, name, host or role, no host, or a ttl as for ``issue``.
        """
        if role not in SERVER_ROLES:
            raise InvalidInputError(
                f"a server certificate's role is one of {', '.join(SERVER_ROLES)}", details={"field": "role"}
            )
        if not hosts:
            raise InvalidInputError("a server certificate needs at least one host", details={"field": "hosts"})
        for host in hosts:
            host_name(host)
        return await self._issue(
            None, csr_pem, node_id=name, role=role, ttl=ttl, checked_key=None, server_hosts=tuple(hosts)
        )

    async def certify_signer(self, public_key: ec.EllipticCurvePublicKey, *, key_id: str) -> tuple[bytes, dt.datetime]:
        """A certificate (DER) for the instruction-signing key ``key_id`` and when it ends: role ``signer``,
        ``DEFAULT_TTL`` long, issued by the oldest root still in the trust bundle, which every daemon pinned (an
        intermediate's rotation never changes it). Not recorded among the node
        certificates: a retired signing key is simply no longer certified, and its certificate ends within a day.
        """
        await self.ensure()
        trusted = trusted_roots(await self._store.repository(CERTIFICATES).keys(self.trust_domain))
        if not trusted:
            raise self._key_changed()
        issuer = trusted[0]
        private = await self._private_key(issuer)
        not_before = utc_seconds(self._clock.now()) - CLOCK_SKEW
        leaf = Leaf(
            name=key_id,
            role=SIGNER_ROLE,
            spiffe_id=f"spiffe://{self.trust_domain}/{SIGNER_ROLE}/{checked_segment(key_id)}",
            public_key=public_key,
            not_before=not_before,
            not_after=min(not_before + DEFAULT_TTL, issuer.not_after),
        )
        _, cert = sign_leaf(leaf, issuer=self._certificate_of(issuer), private=private)
        return cert.public_bytes(serialization.Encoding.DER), leaf.not_after

    async def _issue(
        self,
        tx: Transaction | None,
        csr_pem: str | bytes,
        *,
        node_id: str,
        role: str,
        ttl: dt.timedelta | None,
        checked_key: AcceptedKey | None,
        server_hosts: Sequence[str] = (),
    ) -> IssuedBundle:
        if role in SERVER_ROLES:
            spiffe_id = f"spiffe://{self.trust_domain}/{role}/{checked_segment(node_id)}"
        else:
            spiffe_id = self.spiffe_id(node_id, role)
        lifetime = self._lifetime(role, ttl)
        public_key = checked_key if checked_key is not None else checked_csr_key(csr_pem)
        if tx is None:
            key = await self._active(fresh=True) or await self.ensure()
            private = await self._private_key(key)
        else:
            # No statement and no KMS call here: a read outside ``tx`` would take a second pooled connection per
            # join (which could starve the pool), and the record checks the key is still active anyway.
            active = self._last_active()
            loaded = self._private.get(active.id) if active is not None else None
            if active is None or loaded is None:
                raise self._key_changed()
            key, private = active, loaded
        not_before = utc_seconds(self._clock.now()) - CLOCK_SKEW
        leaf = Leaf(
            name=node_id,
            role=role,
            spiffe_id=spiffe_id,
            public_key=public_key,
            not_before=not_before,
            not_after=min(not_before + lifetime, key.not_after),
            server_hosts=server_hosts,
        )
        serial, cert = sign_leaf(leaf, issuer=self._certificate_of(key), private=private)
        not_after = leaf.not_after
        record = IssuedCertificate(
            serial=serial_hex(serial),
            node_id=node_id,
            spiffe_id=spiffe_id,
            role=role,
            ca_key_id=key.id,
            not_before=not_before,
            not_after=not_after,
            key_sha256=key_sha256(public_key),
        )
        if tx is not None:
            recorded = await tx.repository(CERTIFICATES).record(record)
        else:
            async with self._store.transaction() as own:
                recorded = await own.repository(CERTIFICATES).record(record)
        if not recorded:
            raise self._key_changed()
        return IssuedBundle(
            certificate_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
            chain_pem=key.certificate_pem,
            serial=record.serial,
            spiffe_id=spiffe_id,
            role=role,
            ca_key_id=key.id,
            not_before=not_before,
            not_after=not_after,
        )

    def _lifetime(self, role: str, ttl: dt.timedelta | None) -> dt.timedelta:
        limit = RAMDISK_MAX_TTL if role == "ramdisk" else self._max_ttl
        lifetime = ttl if ttl is not None else min(DEFAULT_TTL, limit)
        if lifetime <= dt.timedelta(0):
            raise InvalidInputError("a certificate's ttl must be positive", details={"field": "ttl"})
        if lifetime > limit:
            raise InvalidInputError(
                f"a {role} certificate lives at most {int(limit.total_seconds())} seconds",
                details={"field": "ttl", "max_seconds": int(limit.total_seconds()), "role": role},
            )
        return lifetime

    # --- revocation ---------------------------------------------------------------------------------------------

    async def revoke(self, serial: int | str, *, reason: str = "") -> RevocationResult:
        """Revoke one certificate and publish ``certificate.revoked`` (key: its SPIFFE ID), in a transaction of its
        own; ``revoke_in`` does it in the caller's.

        Revoking a revoked certificate changes nothing and publishes nothing.

        Raises:
            InvalidInputError: a malformed serial.
            NotFoundError: the CA issued no certificate with this serial.
        """
        return await self._revoke_serial(None, serial, reason)

    async def revoke_in(self, tx: Transaction, serial: int | str, *, reason: str = "") -> RevocationResult:
        """``revoke``, in ``tx``."""
        return await self._revoke_serial(tx, serial, reason)

    async def _revoke_serial(self, tx: Transaction | None, serial: int | str, reason: str) -> RevocationResult:
        canonical = serial_hex(serial)
        issued = await self._certificates(tx).get(canonical)
        if issued is None:
            raise NotFoundError("no certificate with this serial was issued", details={"serial": canonical})
        return await self._revoke(tx, issued.spiffe_id, reason, serial=canonical)

    async def revoke_spiffe_id(self, spiffe_id: str, *, reason: str = "") -> RevocationResult:
        """Revoke every certificate issued to ``spiffe_id`` and publish one ``certificate.revoked`` event for them,
        in a transaction of its own; ``revoke_spiffe_id_in`` does it in the caller's.

        Raises:
            InvalidInputError: not a SPIFFE ID of this trust domain.
        """
        return await self._revoke_identity(None, spiffe_id, reason)

    async def revoke_spiffe_id_in(self, tx: Transaction, spiffe_id: str, *, reason: str = "") -> RevocationResult:
        """``revoke_spiffe_id``, in ``tx``."""
        return await self._revoke_identity(tx, spiffe_id, reason)

    async def _revoke_identity(self, tx: Transaction | None, spiffe_id: str, reason: str) -> RevocationResult:
        if not spiffe_id.startswith(f"spiffe://{self.trust_domain}/"):
            raise InvalidInputError("not a SPIFFE ID of this trust domain", details={"field": "spiffe_id"})
        return await self._revoke(tx, spiffe_id, reason, spiffe_id=spiffe_id)

    async def is_revoked(self, serial: int | str) -> bool:
        """Whether the certificate ``serial`` is revoked (a gateway asks at each handshake)."""
        return await self._store.repository(CERTIFICATES).is_revoked(serial_hex(serial))

    async def _revoke(
        self, tx: Transaction | None, key: str, reason: str, *, serial: str | None = None, spiffe_id: str | None = None
    ) -> RevocationResult:
        if len(reason) > 1000:
            raise InvalidInputError("a revocation reason is at most 1000 characters", details={"field": "reason"})

        async def run(t: Transaction) -> list[Revocation]:
            # Exclusive: a renewal of this identity checks and issues under the shared lock, so it either sees this
            # revocation or its new certificate is revoked by it.
            await t.repository(CERTIFICATES).lock_identity(key, shared=False)
            added = await t.repository(CERTIFICATES).revoke(serial=serial, spiffe_id=spiffe_id, reason=reason)
            await self._publish_revoked(t, added)
            return added

        if tx is not None:
            added = await run(tx)
        else:
            async with self._store.transaction() as own:
                added = await run(own)
        if added:
            log.info("revoked %d certificate(s) of %s", len(added), key)
        return RevocationResult(spiffe_id=key, serials=tuple(r.serial for r in added))

    async def _publish_revoked(self, tx: Transaction, revoked: Sequence[Revocation]) -> None:
        """One ``certificate.revoked`` event per identity among ``revoked``, in the order of their SPIFFE IDs."""
        by_identity: dict[str, list[Revocation]] = {}
        for revocation in revoked:
            by_identity.setdefault(revocation.spiffe_id, []).append(revocation)
        events = [
            OutboxEvent(
                type=REVOKED_EVENT,
                key=spiffe_id,
                payload={"spiffe_id": spiffe_id, "serials": [r.serial for r in rs], "reason": rs[0].reason},
            )
            for spiffe_id, rs in sorted(by_identity.items())
        ]
        if events:
            await tx.publish(events)

    # --- internals ----------------------------------------------------------------------------------------------

    def _last_active(self) -> CaKey | None:
        """The active intermediate of the last read outside a transaction, whatever its age (no I/O); ``None`` if
        none."""
        read = self._read
        return _active_of(read[1], root=False) if read is not None else None

    def _key_changed(self) -> UnavailableError:
        self._forget_keys()  # the retry's prepare() reads the keys again
        return UnavailableError(
            "the CA's signing key changed while this request ran; retry", details={"reason": "ca_key_changed"}
        )

    def _certificate_of(self, key: CaKey) -> x509.Certificate:
        """A key's CA certificate, parsed once per key."""
        cert = self._ca_certs.get(key.id)
        if cert is None:
            cert = self._ca_certs[key.id] = x509.load_pem_x509_certificate(key.certificate_pem.encode())
        return cert

    async def _active(self, *, fresh: bool = False) -> CaKey | None:
        keys = await self._store.repository(CERTIFICATES).keys(self.trust_domain) if fresh else await self.keys()
        return _active_of(keys, root=False)

    def _certificates(self, tx: Transaction | None) -> Certificates:
        """The CA's repository in ``tx``, or outside any transaction when there is none."""
        return tx.repository(CERTIFICATES) if tx is not None else self._store.repository(CERTIFICATES)

    def _context(self, key_id: str) -> str:
        return ca_key_context(self.trust_domain, key_id)

    async def _private_key(self, key: CaKey) -> ec.EllipticCurvePrivateKey:
        cached = self._private.get(key.id)
        if cached is not None:
            return cached
        loaded = await unsealed_ec_key(self._kms, key.sealed_key, context=self._context(key.id), what="CA key")
        self._private[key.id] = loaded
        return loaded

    async def _sealed_key(
        self, *, issuer: tuple[CaKey, ec.EllipticCurvePrivateKey] | None
    ) -> tuple[CaKey, ec.EllipticCurvePrivateKey]:
        """A new active key and its private half, sealed by the KMS; stored by the caller (in no transaction yet).

        A root when ``issuer`` is ``None`` (self-signed, path length 1); otherwise an intermediate certified by that
        root (path length 0), ending no later than it.
        """
        key_id = f"cak_{secrets.token_hex(8)}"
        private = ec.generate_private_key(ec.SECP256R1())
        now = utc_seconds(self._clock.now())
        not_before = now - CLOCK_SKEW
        not_after = now + self._ca_validity
        tier = "root" if issuer is None else "intermediate"
        name = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORG),
                # At most 64 characters, so no trust domain here (they run to 255).
                x509.NameAttribute(NameOID.COMMON_NAME, f"node CA {tier} {key_id}"),
            ]
        )
        public = private.public_key()
        if issuer is None:
            issuer_name, signer, signer_public, path_length = name, private, public, 1
        else:
            issuer_cert = self._certificate_of(issuer[0])
            issuer_name, signer, signer_public, path_length = issuer_cert.subject, issuer[1], issuer[1].public_key(), 0
            not_after = min(not_after, issuer[0].not_after)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer_name)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_public), critical=False)
            .sign(signer, hashes.SHA256())
        )
        der = private.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        sealed = await self._kms.encrypt(der, context=self._context(key_id))
        key = CaKey(
            id=key_id,
            trust_domain=self.trust_domain,
            algorithm=_ALGORITHM,
            sealed_key=sealed,
            certificate_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
            state="active",
            not_after=not_after,
            created_at=now,
            issuer_id=None if issuer is None else issuer[0].id,
        )
        return key, private

    def _created(self, key: CaKey, private: ec.EllipticCurvePrivateKey) -> CaKey:
        """Keep the private half of a key just committed (only then: a rolled-back key must never sign)."""
        self._private[key.id] = private
        log.info("CA key %s of %s created", key.id, self.trust_domain)
        return key
