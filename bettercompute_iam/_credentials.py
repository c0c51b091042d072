"""API credentials: ``bcak_<id>.<secret>``. Only a hash of the secret is stored; it is compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

import attrs

__all__ = ["ParsedCredential", "mint", "parse", "secret_hash", "secret_matches"]

PREFIX = "bcak_"
# fullmatch, not match with "$": "$" also matches before a trailing newline, which would let "<credential>\n" through.
_FORMAT = re.compile(r"bcak_([0-9a-f]{16})\.([A-Za-z0-9_-]{43})")


@attrs.frozen(kw_only=True, repr=False)
class ParsedCredential:
    """A credential split into its public id and its secret (never printed: ``repr`` hides the secret)."""

    id: str
    secret: str

    def __repr__(self) -> str:
        return f"ParsedCredential(id={self.id!r}, secret=<hidden>)"


def parse(credential: str) -> ParsedCredential | None:
    """Split a well-formed credential; ``None`` for anything else (checked without touching the database)."""
    match = _FORMAT.fullmatch(credential)
    if match is None:
        return None
    return ParsedCredential(id=match.group(1), secret=match.group(2))


def mint() -> tuple[str, str, bytes]:
    """A new credential: its id, the full ``bcak_<id>.<secret>`` to show once, and the hash to store."""
    credential_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32)
    return credential_id, f"{PREFIX}{credential_id}.{secret}", secret_hash(secret)


def secret_hash(secret: str) -> bytes:
    """The stored form of a secret. The secret is 256 random bits, so a fast hash is enough to make it useless."""
    return hashlib.sha256(secret.encode()).digest()


def secret_matches(secret: str, stored: bytes) -> bool:
    """Compare in constant time."""
    return hmac.compare_digest(secret_hash(secret), stored)
