"""What a node signs with its key, and how the control plane checks it (renewal and secret requests).

A gateway relays these requests but cannot forge them: each one carries a signature by the node's current
certificate key over a message that binds everything the answer depends on.

- Renewal: ``renew_message(challenge, csr_der)`` = ``b"bettercompute/renew/v1\\n"`` | challenge | SHA-256 of the
  new CSR (DER). The challenge comes from JoinService (``renew_challenge``) and is bound to the certificate's serial,
  so a relay can neither swap in its own CSR nor reuse the signature.
- Join binding: the sealed join payload is ``join_binding(...)`` (32 bytes) | the token. The binding is the SHA-256
  of ``b"bettercompute/join-binding/v1\n"`` | SHA-256 of the CSR (DER) | the canonical JSON (sorted keys, no
  spaces, ASCII) of ``{"claims": ..., "evidence": ..., "pool_id": ...}`` exactly as sent, so a relay cannot pair
  the daemon's sealed token with its own CSR, claims or pool.
- Secret request: ``secret_message(signed_at_ms, nonce, name, jwk_thumbprint)`` = ``b"bettercompute/secret/v1\\n"``
  | signed_at (8 bytes, big-endian milliseconds) | nonce (16) | the name | ``b"\\n"`` | the RFC 7638 thumbprint of
  the ephemeral public JWK, so the answer can only be opened by the key the node made.

Signatures: ECDSA with SHA-256 (DER) for EC keys, Ed25519 as is, RSA PKCS#1 v1.5 with SHA-256.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from bettercompute.errors import InvalidInputError, UnauthenticatedError

__all__ = [
    "BINDING_BYTES",
    "CHALLENGE_BYTES",
    "RENEW_CONTEXT",
    "SECRET_CONTEXT",
    "ChallengeIssuer",
    "join_binding",
    "renew_message",
    "secret_message",
    "verify_signature",
]

RENEW_CONTEXT = b"bettercompute/renew/v1\n"
SECRET_CONTEXT = b"bettercompute/secret/v1\n"
_CHALLENGE_MAGIC = b"bcr1"
_STAMP = 8
_NONCE = 16
_MAC = 32
CHALLENGE_BYTES = len(_CHALLENGE_MAGIC) + _STAMP + _NONCE + _MAC
MAX_SIGNATURE_BYTES = 1024


BINDING_BYTES = 32
_BINDING_CONTEXT = b"bettercompute/join-binding/v1\n"


def join_binding(csr_der: bytes, claims: Any, evidence: Any, pool_id: str | None) -> bytes:
    """What a sealed join token is bound to: the CSR, the claims, the evidence and the pool, as sent.

    Raises:
        InvalidInputError: the claims or the evidence are not JSON values.
    """
    try:
        canonical = json.dumps(
            {"claims": claims, "evidence": evidence or {}, "pool_id": pool_id},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=True,
            allow_nan=False,
        )
    except (TypeError, ValueError):
        raise InvalidInputError("claims and evidence must be JSON values", details={"path": "claims"}) from None
    return hashlib.sha256(_BINDING_CONTEXT + hashlib.sha256(csr_der).digest() + canonical.encode()).digest()


def renew_message(challenge: bytes, csr_der: bytes) -> bytes:
    """The bytes a node signs to renew: the context, the challenge and the SHA-256 of the new CSR (DER)."""
    return RENEW_CONTEXT + challenge + hashlib.sha256(csr_der).digest()


def secret_message(signed_at_ms: int, nonce: bytes, name: str, jwk_thumbprint: str) -> bytes:
    """The bytes a node signs to ask for a secret."""
    return (
        SECRET_CONTEXT
        + signed_at_ms.to_bytes(_STAMP, "big", signed=True)
        + nonce
        + name.encode()
        + b"\n"
        + jwk_thumbprint.encode()
    )


def verify_signature(public_key: object, signature: bytes, message: bytes) -> None:
    """Check ``signature`` over ``message`` by the certificate key ``public_key``.

    Raises:
        UnauthenticatedError: the signature does not verify (``details["reason"] == "bad_signature"``).
    """
    if not isinstance(signature, bytes) or not 0 < len(signature) <= MAX_SIGNATURE_BYTES:
        raise InvalidInputError("signature: expected 1 to 1024 bytes", details={"path": "signature"})
    try:
        if isinstance(public_key, ec.EllipticCurvePublicKey):
            public_key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        elif isinstance(public_key, ed25519.Ed25519PublicKey):
            public_key.verify(signature, message)
        elif isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
        else:
            raise InvalidSignature
    except InvalidSignature:
        raise UnauthenticatedError(
            "the signature does not verify with the certificate's key (no proof of possession)",
            details={"reason": "bad_signature"},
        ) from None


class SecretSource(Protocol):
    """JoinService's keys as a process holds them (``JoinKeyRing``)."""

    async def refresh(self, *, force: bool = False) -> None: ...

    def secrets(self) -> list[bytes]: ...


class ChallengeIssuer:
    """Stateless renewal challenges: ``bcr1`` | issued_at (8, ms) | nonce (16) | HMAC-SHA256 over those and the
    certificate's serial. The MAC key is derived from JoinService's private key, so every api process that holds it
    checks a challenge another one issued; a challenge is accepted once (the caller remembers its nonce). With the
    keys as they rotate (a ``SecretSource``), a challenge is issued with the active key's and checked with any of
    them: call ``refresh()`` before ``issue`` and ``open``."""

    def __init__(self, secret: bytes | SecretSource) -> None:
        self._source = secret
        self._derived: dict[bytes, bytes] = {}

    def __repr__(self) -> str:
        return "ChallengeIssuer()"

    async def refresh(self) -> None:
        """Read the keys again if they are due (nothing with a fixed secret)."""
        if not isinstance(self._source, bytes):
            await self._source.refresh()

    def _keys(self) -> list[bytes]:
        secrets_ = [self._source] if isinstance(self._source, bytes) else self._source.secrets()
        keys = []
        for secret in secrets_:
            key = self._derived.get(secret)
            if key is None:
                key = self._derived[secret] = HKDF(
                    algorithm=hashes.SHA256(), length=32, salt=None, info=b"bettercompute/renew-challenge/v1"
                ).derive(secret)
            keys.append(key)
        return keys

    def issue(self, serial: str, *, now_ms: int) -> bytes:
        """A fresh challenge for the certificate ``serial``."""
        head = _CHALLENGE_MAGIC + now_ms.to_bytes(_STAMP, "big", signed=True) + secrets.token_bytes(_NONCE)
        return head + self._mac(self._keys()[0], head, serial)

    def open(self, challenge: bytes, serial: str) -> tuple[int, bytes]:
        """``(issued_at_ms, nonce)`` of a challenge this service issued for ``serial``.

        Raises:
            InvalidInputError: not a challenge (wrong size or prefix).
            UnauthenticatedError: not issued by this service, or for another certificate (reason
                ``bad_challenge``).
        """
        if not isinstance(challenge, bytes) or len(challenge) != CHALLENGE_BYTES:
            raise InvalidInputError("challenge: not a renewal challenge", details={"path": "challenge"})
        if not challenge.startswith(_CHALLENGE_MAGIC):
            raise InvalidInputError("challenge: not a renewal challenge", details={"path": "challenge"})
        head, mac = challenge[:-_MAC], challenge[-_MAC:]
        if not any(hmac.compare_digest(mac, self._mac(key, head, serial)) for key in self._keys()):
            raise UnauthenticatedError(
                "the challenge was not issued by this service for this certificate; ask for a new one",
                details={"reason": "bad_challenge"},
            )
        stamp = int.from_bytes(head[len(_CHALLENGE_MAGIC) : len(_CHALLENGE_MAGIC) + _STAMP], "big", signed=True)
        return stamp, head[-_NONCE:]

    @staticmethod
    def _mac(key: bytes, head: bytes, serial: str) -> bytes:
        return hmac.new(key, head + b"\n" + serial.encode(), hashlib.sha256).digest()
