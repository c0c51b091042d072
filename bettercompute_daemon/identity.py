"""The daemon's side of node identity: its key and CSR, the sealed join token, and what it signs.

The daemon may not import the control plane, so the wire formats live here a second time; the tests check both
sides against each other (``tests/integration/joins``). The formats:

- Sealed token: ``b"bcj1"`` | HPKE (X25519, HKDF-SHA256, AES-256-GCM; ``info`` ``b"bettercompute/join/v1"``) of
  sealed_at (8 bytes, big-endian ms since the epoch) | nonce (16) | binding (32) | the token text. The binding is
  SHA-256 of ``b"bettercompute/join-binding/v1\n"`` | SHA-256 of the CSR (DER) | the canonical JSON (sorted keys,
  no spaces, ASCII) of ``{"claims", "evidence", "pool_id"}`` as sent: the token is good only with them.
- Renewal proof: the signature over ``b"bettercompute/renew/v1\\n"`` | challenge | SHA-256 of the new CSR (DER).
- Secret request: the signature over ``b"bettercompute/secret/v1\\n"`` | signed_at (8, ms) | nonce (16) | name |
  ``b"\\n"`` | RFC 7638 thumbprint of the ephemeral public JWK.
- Ramdisk report (``docs/metal-wire.md``): the signature over ``b"bettercompute/ramdisk-report/v1\\n"`` | the
  canonical JSON of ``{"machine_id", "task_id", "kind", "ok", "result", "error", "signed_at_ms"}``.

Signatures are ECDSA P-256 with SHA-256 (the key ``NodeKey`` makes).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import secrets
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, hpke, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from cryptography.x509.oid import NameOID
from joserfc import jwe
from joserfc.jwk import ECKey

__all__ = ["EphemeralKey", "NodeKey", "SecretRequestProof", "join_binding", "ramdisk_report_message", "seal_token"]

_INFO = b"bettercompute/join/v1"
_SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)
_RENEW = b"bettercompute/renew/v1\n"
_SECRET = b"bettercompute/secret/v1\n"
_BINDING = b"bettercompute/join-binding/v1\n"
_RAMDISK_REPORT = b"bettercompute/ramdisk-report/v1\n"


def _ms(at: dt.datetime) -> int:
    return int(at.timestamp() * 1000)


def join_binding(csr_pem: str, claims: Any, evidence: Any = None, pool_id: str | None = None) -> bytes:
    """The 32 bytes the sealed token is bound to (see the module docstring)."""
    csr_der = x509.load_pem_x509_csr(csr_pem.encode()).public_bytes(serialization.Encoding.DER)
    canonical = json.dumps(
        {"claims": claims, "evidence": evidence or {}, "pool_id": pool_id},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    )
    return hashlib.sha256(_BINDING + hashlib.sha256(csr_der).digest() + canonical.encode()).digest()


def ramdisk_report_message(
    *,
    machine_id: str,
    task_id: str,
    kind: str,
    ok: bool,
    result: Any,
    error: str | None,
    signed_at_ms: int,
) -> bytes:
    """The bytes a ramdisk signs for one task's report (see the module docstring). The control plane keeps a copy of
    this function; a test holds the two against each other.

    Raises:
        ValueError: ``result`` holds a float that is not finite (JSON has no NaN or infinity).
        TypeError: ``result`` holds something JSON cannot say.
    """
    canonical = json.dumps(
        {
            "machine_id": machine_id,
            "task_id": task_id,
            "kind": kind,
            "ok": ok,
            "result": result,
            "error": error,
            "signed_at_ms": signed_at_ms,
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    )
    return _RAMDISK_REPORT + canonical.encode()


def seal_token(join_key: str, token: str, *, binding: bytes, now: dt.datetime | None = None) -> bytes:
    """Seal ``token`` to JoinService's public key (``--join-key``: base64url of 32 bytes), stamped now, bound to
    ``binding`` (``join_binding`` of the request it goes with)."""
    if len(binding) != 32:
        raise ValueError("the binding is 32 bytes")
    raw = base64.urlsafe_b64decode(join_key + "=" * (-len(join_key) % 4))
    public = X25519PublicKey.from_public_bytes(raw)
    stamp = _ms(now or dt.datetime.now(dt.UTC)).to_bytes(8, "big", signed=True)
    return b"bcj1" + _SUITE.encrypt(stamp + secrets.token_bytes(16) + binding + token.encode(), public, info=_INFO)


class NodeKey:
    """The node's private key (ECDSA P-256). It never leaves the machine; only CSRs and signatures do."""

    def __init__(self, private_key: ec.EllipticCurvePrivateKey | None = None) -> None:
        self.private_key = private_key or ec.generate_private_key(ec.SECP256R1())

    def __repr__(self) -> str:
        return "NodeKey(<private>)"

    def csr_pem(self, hostname: str = "node") -> str:
        """A CSR for this key (the CA ignores its subject and sets the SPIFFE ID itself)."""
        csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)]))
            .sign(self.private_key, hashes.SHA256())
        )
        return csr.public_bytes(serialization.Encoding.PEM).decode()

    def private_key_pem(self) -> bytes:
        """The key as unencrypted PKCS#8 PEM, for the TLS stack (keep the file mode 0600)."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def sign(self, message: bytes) -> bytes:
        """An ECDSA-SHA256 signature (DER)."""
        return self.private_key.sign(message, ec.ECDSA(hashes.SHA256()))

    def renewal_proof(self, challenge: bytes, new_csr_pem: str) -> bytes:
        """The proof of possession that goes with a renewal: this key's signature over the challenge and the CSR."""
        csr_der = x509.load_pem_x509_csr(new_csr_pem.encode()).public_bytes(serialization.Encoding.DER)
        return self.sign(_RENEW + challenge + hashlib.sha256(csr_der).digest())

    def secret_request(
        self, name: str, ephemeral: EphemeralKey, *, now: dt.datetime | None = None
    ) -> SecretRequestProof:
        """The signed fields of a secret request for ``name``, answered to ``ephemeral``."""
        signed_at_ms = _ms(now or dt.datetime.now(dt.UTC))
        nonce = secrets.token_bytes(16)
        message = (
            _SECRET
            + signed_at_ms.to_bytes(8, "big", signed=True)
            + nonce
            + name.encode()
            + b"\n"
            + ephemeral.thumbprint().encode()
        )
        return SecretRequestProof(signed_at_ms=signed_at_ms, nonce=nonce, signature=self.sign(message))


class SecretRequestProof:
    """``signed_at_ms``, ``nonce`` and ``signature`` of one secret request."""

    def __init__(self, *, signed_at_ms: int, nonce: bytes, signature: bytes) -> None:
        self.signed_at_ms = signed_at_ms
        self.nonce = nonce
        self.signature = signature


class EphemeralKey:
    """A key made for one secret request: send ``public_jwk()``, open the answer with ``open()``, then drop it."""

    def __init__(self) -> None:
        self._key = ECKey.generate_key("P-256", private=True)

    def __repr__(self) -> str:
        return "EphemeralKey(<private>)"

    def public_jwk(self) -> dict[str, Any]:
        """The public half as a JWK."""
        return dict(self._key.as_dict(private=False))

    def thumbprint(self) -> str:
        """Its RFC 7638 thumbprint (what the request's signature covers)."""
        return str(self._key.thumbprint())

    def open(self, token: str) -> bytes:
        """The plaintext of the broker's JWE answer."""
        return bytes(jwe.decrypt_compact(token, self._key).plaintext or b"")
