"""Sealing for ``Join``: a payload (the join token) sealed by ``bcd`` to JoinService's X25519 public key.

HPKE (RFC 9180, base mode) with X25519 / HKDF-SHA256 / AES-256-GCM, under a versioned ``info``
(``b"bettercompute/join/v1"``). What is sealed carries the time of sealing and a random 16-byte nonce::

    sealed    = b"bcj1" | HPKE ciphertext (enc (32) | AES-256-GCM ciphertext and tag)
    plaintext = sealed_at (8, big-endian milliseconds since the epoch) | nonce (16) | payload

``Unsealer.unseal`` refuses, in this order:

- ``INVALID_INPUT`` (``details["reason"] == "malformed"``): not a sealed payload of this version (wrong prefix,
  too short, too long). No cryptography ran; the sender has a bug.
- ``UNAUTHENTICATED`` (``reason`` ``"unopenable"``): sealed to another key, tampered with, or sealed under another
  ``info`` (HPKE cannot tell these apart, and neither does the error).
- ``UNAUTHENTICATED`` (``reason`` ``"expired"`` / ``"from_the_future"``): sealed more than ``max_age`` ago, or more
  than ``max_skew`` ahead of ``now``. Seal again and retry.
- ``UNAUTHENTICATED`` (``reason`` ``"replayed"``): this nonce was already unsealed (the ``ReplayGuard`` remembers
  each nonce until its payload would be refused as expired anyway).

Messages and details never carry key material, the payload or the nonce.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import secrets
import time
from typing import Protocol

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from bettercompute.errors import InvalidInputError, UnauthenticatedError
from bettercompute.ports import ReplayGuard

__all__ = [
    "JOIN_INFO",
    "MAX_SEALED_BYTES",
    "JoinKeyPair",
    "Unsealed",
    "Unsealer",
    "parse_public_key",
    "seal",
]

JOIN_INFO = b"bettercompute/join/v1"
"""The HPKE ``info`` of version 1: a payload sealed under another version's ``info`` does not open."""

_MAGIC = b"bcj1"
_SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_256_GCM)
_ENC = 32
_TAG = 16
_STAMP = 8
_NONCE = 16
MAX_SEALED_BYTES = 16 * 1024
"""The largest sealed payload ``unseal`` looks at (a join token is some 60 bytes)."""
_MIN_SEALED = len(_MAGIC) + _ENC + _STAMP + _NONCE + _TAG
REPLAY_SCOPE = "join/v1"


def _ms(at: dt.datetime) -> int:
    if at.tzinfo is None:
        raise ValueError("a timezone-aware datetime is required")
    return int(at.timestamp() * 1000)


def parse_public_key(text: str) -> X25519PublicKey:
    """A public key from ``JoinKeyPair.public_key_text()`` (base64url of the 32 raw bytes, padding optional).

    Raises:
        InvalidInputError: not the base64url of 32 bytes.
    """
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise InvalidInputError("not an X25519 public key (base64url of 32 bytes)", details={"reason": "malformed"})
    return X25519PublicKey.from_public_bytes(raw)


@attrs.frozen(repr=False, eq=False)
class JoinKeyPair:
    """JoinService's X25519 key pair. Keep ``private_bytes()`` sealed by the KMS; publish ``public_key_text()``.

    Its ``repr`` shows the public key only.
    """

    private_key: X25519PrivateKey

    @classmethod
    def generate(cls) -> JoinKeyPair:
        """A fresh key pair."""
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> JoinKeyPair:
        """The pair of a stored 32-byte private key.

        Raises:
            InvalidInputError: not 32 bytes.
        """
        if len(raw) != 32:
            raise InvalidInputError("an X25519 private key is 32 bytes", details={"reason": "malformed"})
        return cls(X25519PrivateKey.from_private_bytes(raw))

    @property
    def public_key(self) -> X25519PublicKey:
        """The public key."""
        return self.private_key.public_key()

    def private_bytes(self) -> bytes:
        """The 32 raw bytes of the private key (to seal with the KMS for storage)."""
        return self.private_key.private_bytes(
            serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
        )

    def public_key_text(self) -> str:
        """The public key for the install script and ``bcd``: base64url of its 32 raw bytes, without padding."""
        raw = self.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    def __repr__(self) -> str:
        return f"JoinKeyPair(public_key={self.public_key_text()!r})"


def seal(public_key: X25519PublicKey | str, plaintext: bytes, *, now: dt.datetime) -> bytes:
    """Seal ``plaintext`` to ``public_key`` (the daemon's side), stamped with ``now`` and a fresh random nonce."""
    key = parse_public_key(public_key) if isinstance(public_key, str) else public_key
    inner = _ms(now).to_bytes(_STAMP, "big", signed=True) + secrets.token_bytes(_NONCE) + plaintext
    return _MAGIC + _SUITE.encrypt(inner, key, info=JOIN_INFO)


@attrs.frozen(kw_only=True, repr=False)
class Unsealed:
    """What ``unseal`` opened: the payload and when it was sealed (its ``repr`` hides the payload)."""

    plaintext: bytes
    sealed_at: dt.datetime

    def __repr__(self) -> str:
        return f"Unsealed(sealed_at={self.sealed_at.isoformat()!r}, plaintext=<hidden>)"


class KeySource(Protocol):
    """JoinService's keys as a process holds them (``JoinKeyRing``): the ones that open sealed tokens now."""

    async def refresh(self, *, force: bool = False) -> None: ...

    def pairs(self) -> list[JoinKeyPair]: ...


class Unsealer:
    """JoinService's side: opens payloads sealed to JoinService's key once each, while they are fresh.

    Args:
        key_pair: JoinService's key pair, or its keys as they rotate (a ``KeySource``: the active key, then the
            previous ones in their overlap; read again at once when a payload opens with none of them).
        replay_guard: Where seen nonces are remembered. Every Unsealer of a deployment must share one
            (``store.nonces`` of the PostgreSQL store); ``bettercompute.testing.InMemoryReplayGuard`` is for tests.
        max_skew: How far ahead of ``now`` a sealing time may be (the daemon's clock may run ahead).
    """

    def __init__(
        self,
        key_pair: JoinKeyPair | KeySource,
        replay_guard: ReplayGuard,
        *,
        max_skew: dt.timedelta = dt.timedelta(minutes=1),
    ) -> None:
        self._keys = key_pair
        self._guard = replay_guard
        self._max_skew = max_skew
        self._forced_at = -1.0

    def __repr__(self) -> str:
        return f"Unsealer(keys={self._keys!r})"

    async def _open(self, body: bytes) -> bytes | None:
        """``body`` opened with the first key that opens it; ``None`` when none does."""
        keys = self._keys
        if isinstance(keys, JoinKeyPair):
            return _decrypt(body, [keys])
        await keys.refresh()
        tried = keys.pairs()
        opened = _decrypt(body, tried)
        # Sealed to a key this process has not read yet (rotated a moment ago elsewhere)? Read the keys again, at
        # most once a second, whatever a sender makes us try.
        if opened is None and time.monotonic() - self._forced_at >= 1.0:
            self._forced_at = time.monotonic()
            await keys.refresh(force=True)
            opened = _decrypt(body, [p for p in keys.pairs() if all(p is not t for t in tried)])
        return opened

    async def unseal(self, sealed: bytes, *, now: dt.datetime, max_age: dt.timedelta) -> Unsealed:
        """Open ``sealed`` once: refused if malformed, unopenable, too old, from the future or already seen.

        Raises:
            InvalidInputError: not a sealed payload of this version (``details["reason"] == "malformed"``).
            UnauthenticatedError: ``details["reason"]`` is ``"unopenable"`` (another key, tampered, another
                version), ``"expired"``, ``"from_the_future"`` or ``"replayed"``.
        """
        if not _MIN_SEALED <= len(sealed) <= MAX_SEALED_BYTES or not sealed.startswith(_MAGIC):
            raise InvalidInputError(
                "not a sealed join payload of version 1", details={"path": "sealed_token", "reason": "malformed"}
            )
        inner = await self._open(sealed[len(_MAGIC) :])
        if inner is None:
            raise UnauthenticatedError(
                "the sealed payload does not open with this service's key (another key, or tampered with)",
                details={"reason": "unopenable"},
            )
        if len(inner) < _STAMP + _NONCE:  # only a sender holding a faulty sealer gets here: it authenticated
            raise InvalidInputError(
                "the sealed payload has no timestamp and nonce", details={"path": "sealed_token", "reason": "malformed"}
            )
        stamp = int.from_bytes(inner[:_STAMP], "big", signed=True)
        nonce = inner[_STAMP : _STAMP + _NONCE]
        now_ms = _ms(now)
        if stamp < now_ms - max_age.total_seconds() * 1000:
            raise UnauthenticatedError(
                f"the sealed payload is older than {max_age.total_seconds():g} seconds: seal it again",
                details={"reason": "expired"},
            )
        if stamp > now_ms + self._max_skew.total_seconds() * 1000:
            raise UnauthenticatedError(
                "the sealed payload is stamped in the future: check the sender's clock",
                details={"reason": "from_the_future"},
            )
        sealed_at = dt.datetime.fromtimestamp(stamp / 1000, dt.UTC)
        # Remembered until the stamp would be refused as expired anyway (plus the skew, for safety).
        expires_at = sealed_at + max_age + self._max_skew
        if not await self._guard.first_use(REPLAY_SCOPE, nonce, expires_at=expires_at, now=now):
            raise UnauthenticatedError("this sealed payload was already used", details={"reason": "replayed"})
        return Unsealed(plaintext=inner[_STAMP + _NONCE :], sealed_at=sealed_at)


def _decrypt(body: bytes, pairs: list[JoinKeyPair]) -> bytes | None:
    for pair in pairs:
        try:
            opened: bytes = _SUITE.decrypt(body, pair.private_key, info=JOIN_INFO)
        except InvalidTag:
            continue
        return opened
    return None
