"""Instructions the control plane signs: desired states and commands (issue 30, item 4).

A gateway relays what the control plane tells a node; it holds no key that could make an instruction up. The api and
worker processes sign each desired state and command with the instruction-signing key when they write it, and the
signature is stored beside the exact JSON text it covers. The gateway sends both, with the key's certificate from the
node CA (role ``signer``); the daemon checks the certificate against its trust bundle and the signature over
``desired_state_message`` or ``command_message`` before it acts, and refuses a desired state older than one it
applied or a command past its deadline. So a gateway can delay or drop instructions, never forge or alter them.

The key. ECDSA P-256, made once per trust domain (whichever process comes first), sealed by the KMS (context
``signer:<trust-domain>:<key-id>``) and stored in ``signing_keys`` with its certificate; its private half exists only
in the memory of the api and worker processes (a gateway never loads it: its role cannot read the table, and it has
no KMS). The certificate lives a day and is renewed at half of that; a key rotates with ``rotate()`` (the old one
becomes ``previous``: what it signed still holds) and ``retire()`` stops gateways sending its certificate.

Signing happens inside the writing transaction (a signature is CPU work), so the key is loaded before it:
``prepared_signer(context)`` (a KMS call, outside any transaction) gives a ``Signing`` whose ``sign`` needs no I/O.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import secrets
import struct
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bettercompute.errors import FailedPreconditionError, InternalError, NotFoundError
from bettercompute.modules.nodes._port import CERTIFICATES, NODES, InstructionSignature, SigningKey
from bettercompute.modules.nodes._x509 import unsealed_ec_key
from bettercompute.ports import Clock, Kms, Store

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext
    from bettercompute.modules.nodes._ca import CertificateAuthority

__all__ = [
    "InstructionSigner",
    "Signing",
    "command_message",
    "deadline_ms",
    "desired_state_message",
    "prepared_signer",
    "register_signer",
    "signing_key_context",
]

log = logging.getLogger("bettercompute.nodes")

_DESIRED_STATE = b"bettercompute/v1/desired-state\x00"
_COMMAND = b"bettercompute/v1/command\x00"
RETIRE_AFTER = dt.timedelta(days=1)
"""How long after a rotation the previous instruction key may be retired without ``force``: longer than the commands
it signed stay open (an acceptance check's deadline is minutes)."""
RESIGN_BATCH = 500
"""How many desired states one transaction of a retire signs again."""
_RENEW_WHEN_LEFT = dt.timedelta(hours=12)
"""A signing key's certificate is renewed when less than this is left of it (it lives a day)."""


def _framed(*parts: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(part)) + part for part in parts)


def desired_state_message(*, node_id: str, generation: int, content_json: str) -> bytes:
    """The bytes the instruction key signs for a desired state: a context, the node id length-prefixed, the
    generation and the content as its SHA-256.

    The daemon checks the same bytes made by ``bettercompute_proto.desired_state_message`` (the core imports no wire
    code, so it is written twice; ``tests/unit/nodes/test_facts.py`` holds the two to the same bytes).
    """
    digest = hashlib.sha256(content_json.encode()).digest()
    return _DESIRED_STATE + _framed(node_id.encode()) + struct.pack(">q", generation) + digest


def command_message(*, command_id: str, node_id: str, kind: str, arguments_json: str, deadline_ms: int) -> bytes:
    """The bytes the instruction key signs for a command: a context, the command id, the node id and the kind
    length-prefixed, the arguments as their SHA-256 and the deadline in milliseconds (the daemon's side:
    ``bettercompute_proto.command_message``)."""
    digest = hashlib.sha256(arguments_json.encode()).digest()
    parts = _framed(command_id.encode(), node_id.encode(), kind.encode(), digest)
    return _COMMAND + parts + struct.pack(">q", deadline_ms)


def deadline_ms(deadline: dt.datetime) -> int:
    """A command's deadline as the milliseconds a gateway sends (the deadline is stored in whole milliseconds, so
    the two sides never round differently)."""
    return int(deadline.timestamp() * 1000)


def signing_key_context(trust_domain: str, key_id: str) -> str:
    """The KMS context an instruction key's private half is sealed under."""
    return f"signer:{trust_domain}:{key_id}"


@attrs.frozen
class Signing:
    """A loaded instruction-signing key: ``sign`` makes a signature with no I/O (inside a transaction)."""

    key_id: str
    private: ec.EllipticCurvePrivateKey = attrs.field(repr=False)

    def sign(self, message: bytes) -> InstructionSignature:
        """The key's signature over ``message`` (ECDSA P-256, SHA-256, DER)."""
        return InstructionSignature(signature=self.private.sign(message, ec.ECDSA(hashes.SHA256())), signer=self.key_id)


class InstructionSigner:
    """The instruction-signing keys of one trust domain: made, certified, loaded, rotated and retired.

    Args:
        store: Where the keys live (``Certificates.signing_keys``).
        kms: Seals the private keys.
        ca: The node CA that certifies them.
        clock: Time source.
        refresh: How long ``prepare`` reuses what it read before reading the keys again (a rotation elsewhere
            shows this late in this process).
        timer: Seconds of a monotonic clock (tests inject one).
    """

    def __init__(
        self,
        store: Store,
        kms: Kms,
        ca: CertificateAuthority,
        *,
        clock: Clock,
        refresh: dt.timedelta = dt.timedelta(seconds=5),
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._kms = kms
        self._ca = ca
        self.trust_domain = ca.trust_domain
        self._clock = clock
        self._refresh = refresh.total_seconds()
        self._timer = timer
        self._private: dict[str, ec.EllipticCurvePrivateKey] = {}
        self._ready: tuple[float, Signing] | None = None

    def __repr__(self) -> str:
        return f"InstructionSigner(trust_domain={self.trust_domain!r})"

    async def keys(self) -> list[SigningKey]:
        """Every signing key of the trust domain, oldest first."""
        return await self._store.repository(CERTIFICATES).signing_keys(self.trust_domain)

    async def prepare(self, *, fresh: bool = False) -> Signing:
        """The active key, loaded: made (once, whichever process comes first) when there is none, its certificate
        (and the previous keys') renewed when it ends within ``_RENEW_WHEN_LEFT`` or its issuer left the trust
        bundle. Call it before the transaction that signs (it may call the KMS). What it read is reused for
        ``refresh`` unless ``fresh``."""
        ready = self._ready
        if not fresh and ready is not None and self._timer() - ready[0] < self._refresh:
            return ready[1]
        keys = await self.keys()
        active = next((k for k in keys if k.state == "active"), None)
        if active is None:
            active = await self._create()
        private = await self._private_key(active)
        # The previous keys' certificates too: what they signed must keep verifying until they are retired.
        for key in [active, *(k for k in keys if k.state == "previous")]:
            if await self._needs_certificate(key):
                await self._certify(key)
        signing = Signing(active.id, private)
        self._ready = (self._timer(), signing)
        return signing

    async def rotate(self) -> SigningKey:
        """Make a new active key; the current one becomes ``previous`` (what it signed still holds, and gateways
        still send its certificate until ``retire``)."""
        key, private = await self._new_key("active")
        async with self._store.transaction() as tx:
            certificates = tx.repository(CERTIFICATES)
            await certificates.lock(self.trust_domain)
            for old in await certificates.signing_keys(self.trust_domain):
                if old.state == "active":
                    await certificates.set_signing_key(trust_domain=self.trust_domain, id=old.id, state="previous")
            await certificates.add_signing_key(key)
        self._private[key.id] = private
        self._ready = None
        log.info("instruction-signing key %s of %s made active", key.id, self.trust_domain)
        return key

    async def retire(self, key_id: str, *, force: bool = False) -> SigningKey:
        """Stop trusting a ``previous`` key: first every current desired state it signed is signed again with the
        active key (in batches, each its own transaction, so an interrupted retire is finished by running it
        again), then gateways stop sending its certificate. A command it signed that is still open is refused by
        its node from then on (answered as failed), which is why a key made ``previous`` less than
        ``RETIRE_AFTER`` ago is retired only with ``force``.

        Raises:
            NotFoundError: no such key.
            FailedPreconditionError: the key is the active one, or became ``previous`` too recently (without
                ``force``).
        """
        key = next((k for k in await self.keys() if k.id == key_id), None)
        if key is None:
            raise NotFoundError("no such signing key", details={"key_id": key_id})
        if key.state == "retired":
            return key
        if key.state == "active":
            raise FailedPreconditionError(
                "the active signing key cannot be retired; rotate first", details={"key_id": key_id}
            )
        since = key.previous_at or key.created_at
        if not force and self._clock.now() - since < RETIRE_AFTER:
            raise FailedPreconditionError(
                "commands this key signed may still be open; retire it a day after the rotation, or force it",
                details={"key_id": key_id, "retire_after": (since + RETIRE_AFTER).isoformat()},
            )
        resigned = await self._sign_again(key_id)
        async with self._store.transaction() as tx:
            certificates = tx.repository(CERTIFICATES)
            await certificates.lock(self.trust_domain)
            await certificates.set_signing_key(trust_domain=self.trust_domain, id=key_id, state="retired")
        # Once more: a state another process signed with it between the pass and the retire (only with ``force``
        # can one still hold it as active, for the few seconds it reads the keys again).
        resigned += await self._sign_again(key_id)
        self._private.pop(key_id, None)
        log.info(
            "instruction-signing key %s of %s retired (%d desired states signed again)",
            key_id,
            self.trust_domain,
            resigned,
        )
        return next(k for k in await self.keys() if k.id == key_id)

    async def _sign_again(self, key_id: str) -> int:
        """Sign every current desired state ``key_id`` signed again with the active key; how many."""
        done = 0
        while True:
            signing = await self.prepare()
            async with self._store.transaction() as tx:
                nodes = tx.repository(NODES)
                batch = await nodes.signed_by(key_id, limit=RESIGN_BATCH)
                for desired in batch:
                    message = desired_state_message(
                        node_id=desired.node_id, generation=desired.generation, content_json=desired.text or ""
                    )
                    if await nodes.resign_desired(attrs.evolve(desired, instruction=signing.sign(message))):
                        done += 1
            if len(batch) < RESIGN_BATCH:
                return done

    async def _create(self) -> SigningKey:
        key, private = await self._new_key("active")  # sealed and certified before the transaction
        async with self._store.transaction() as tx:
            certificates = tx.repository(CERTIFICATES)
            await certificates.lock(self.trust_domain)
            current = next((k for k in await certificates.signing_keys(self.trust_domain) if k.state == "active"), None)
            if current is None:
                await certificates.add_signing_key(key)
        if current is not None:
            return current  # another process made one meanwhile: ours, never stored, is dropped
        self._private[key.id] = private
        log.info("instruction-signing key %s of %s made", key.id, self.trust_domain)
        return key

    async def _new_key(self, state: str) -> tuple[SigningKey, ec.EllipticCurvePrivateKey]:
        key_id = f"sgk_{secrets.token_hex(8)}"
        private = ec.generate_private_key(ec.SECP256R1())
        der = private.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        sealed = await self._kms.encrypt(der, context=self._context(key_id))
        certificate, not_after = await self._ca.certify_signer(private.public_key(), key_id=key_id)
        now = self._clock.now()
        key = SigningKey(
            id=key_id,
            trust_domain=self.trust_domain,
            sealed_key=sealed,
            certificate_der=certificate,
            certificate_not_after=not_after,
            state=state,
            created_at=now,
        )
        return key, private

    async def _needs_certificate(self, key: SigningKey) -> bool:
        if key.certificate_not_after - self._clock.now() < _RENEW_WHEN_LEFT:
            return True
        certificate = x509.load_der_x509_certificate(key.certificate_der)
        for issuer in await self._ca.trust_bundle():
            try:
                certificate.verify_directly_issued_by(issuer)
            except (ValueError, TypeError, InvalidSignature):
                continue
            return False
        return True  # its issuer was retired from the bundle

    async def _certify(self, key: SigningKey) -> None:
        """Certify ``key`` again (its public key is the one in its current certificate: no KMS call)."""
        public = x509.load_der_x509_certificate(key.certificate_der).public_key()
        if not isinstance(public, ec.EllipticCurvePublicKey):
            raise InternalError("a signing key's certificate does not hold an EC key")
        certificate = await self._ca.certify_signer(public, key_id=key.id)
        async with self._store.transaction() as tx:
            await tx.repository(CERTIFICATES).set_signing_key(
                trust_domain=self.trust_domain, id=key.id, certificate=certificate
            )
        log.info("instruction-signing key %s of %s certified again", key.id, self.trust_domain)

    def _context(self, key_id: str) -> str:
        return signing_key_context(self.trust_domain, key_id)

    async def _private_key(self, key: SigningKey) -> ec.EllipticCurvePrivateKey:
        cached = self._private.get(key.id)
        if cached is not None:
            return cached
        loaded = await unsealed_ec_key(self._kms, key.sealed_key, context=self._context(key.id), what="signing key")
        self._private[key.id] = loaded
        return loaded


_SIGNERS: weakref.WeakKeyDictionary[Store, InstructionSigner] = weakref.WeakKeyDictionary()


def register_signer(store: Store, signer: InstructionSigner) -> None:
    """Make ``signer`` the one jobs and methods on ``store`` sign with (the nodes module does it at start)."""
    _SIGNERS[store] = signer


def signer_of(store: Store) -> InstructionSigner | None:
    """The signer registered for ``store``, or ``None`` (node identity off, or a gateway-only process)."""
    return _SIGNERS.get(store)


async def prepared_signer(context: ModuleContext) -> Signing | None:
    """The loaded instruction key of this control plane, or ``None`` where node identity is off (then nothing is
    signed, and no daemon can join to be told anything). Call it before the transaction that signs."""
    signer = _SIGNERS.get(context.store)
    return await signer.prepare() if signer is not None else None
