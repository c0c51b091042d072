"""Join tokens as a daemon and JoinService see them: their format, their hash, and the join configuration.

A token is ``bcjt_<id>.<secret>``: ``<id>`` is the token's id (``jt_`` and 20 hex digits), ``<secret>`` 32 random
bytes in URL-safe base64 (43 characters). Only ``hash_secret(secret)``, SHA-256 of the secret's text, is stored;
``parse_token`` splits a token and ``secret_matches`` compares in constant time.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import re
import secrets

import attrs

__all__ = [
    "IDENTITY_NEEDS",
    "TOKEN_PREFIX",
    "JoinSettings",
    "hash_secret",
    "new_token",
    "parse_token",
    "secret_matches",
]

IDENTITY_NEEDS = (
    "node identity (JoinService, the node CA, the gateway services) needs Options.join and Options.kms: a"
    " bettercompute.JoinSettings, and a KMS to seal the CA's and JoinService's keys (bettercompute.LocalKeyKms(path))"
)
"""What a call that needs node identity answers where it is off (``FAILED_PRECONDITION``)."""
TOKEN_PREFIX = "bcjt_"  # noqa: S105 - the prefix of join tokens, not a secret
_TOKEN = re.compile(r"bcjt_(jt_[0-9a-f]{20})\.([A-Za-z0-9_-]{43})")
_TRUST_DOMAIN = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
_ADDRESS = re.compile(r"[A-Za-z0-9.-]{1,253}:[0-9]{1,5}")


@attrs.frozen(kw_only=True)
class JoinSettings:
    """What ``bcd join`` is pinned to (``Options.join``); ``join-tokens.create`` renders it into the join command,
    together with the live CA bundle and JoinService's public key (both read from the store, so a rotation shows
    up in the next command).

    Setting it (with ``Options.kms``) also turns on JoinService, the CA of ``trust_domain`` and
    ``compute.gateway_services``.

    Args:
        gateway_address: ``host:port`` the daemon dials (``gw.eu-1.example.com:443``).
        trust_domain: The SPIFFE trust domain of node identities (``example.com``).
        sealed_token_max_age: How old a sealed join token may be when it arrives (the daemon seals it right before
            sending).
        certificate_ttl: The lifetime of the certificates a join or a renewal gives a node (24 hours by default;
            ``bcd node`` renews at about two thirds of it). Certificates are backdated by a minute for slow clocks,
            so a lifetime of a minute or less would be expired when issued.
        tunnel_gateway: ``host:port`` a tunnel's client dials (``nodes.tunnel``'s answer); ``gateway_address`` when
            unset. Its server certificate must chain to the node CA (the answer's ``ca_pem``).
    """

    gateway_address: str
    trust_domain: str
    sealed_token_max_age: dt.timedelta = dt.timedelta(minutes=5)
    certificate_ttl: dt.timedelta = dt.timedelta(hours=24)
    tunnel_gateway: str | None = None

    def problems(self) -> list[str]:
        """What is wrong with these settings (``better_compute()`` reports it as ``INVALID_CONFIG``)."""
        problems = []
        if not _ADDRESS.fullmatch(self.gateway_address):
            problems.append("join.gateway_address: must be host:port")
        if self.tunnel_gateway is not None and not _ADDRESS.fullmatch(self.tunnel_gateway):
            problems.append("join.tunnel_gateway: must be host:port")
        if not _TRUST_DOMAIN.fullmatch(self.trust_domain):
            problems.append("join.trust_domain: must be a lower-case DNS name")
        if not dt.timedelta(seconds=10) <= self.sealed_token_max_age <= dt.timedelta(hours=1):
            problems.append("join.sealed_token_max_age: must be between 10 seconds and 1 hour")
        if not dt.timedelta(minutes=1) < self.certificate_ttl <= dt.timedelta(hours=24):
            problems.append("join.certificate_ttl: must be more than 1 minute and at most 24 hours")
        return problems


def new_token() -> tuple[str, str, bytes]:
    """A fresh token: ``(id, token, secret_hash)``; show ``token`` once and store only ``secret_hash``."""
    token_id = f"jt_{secrets.token_hex(10)}"
    secret = secrets.token_urlsafe(32)
    return token_id, f"{TOKEN_PREFIX}{token_id}.{secret}", hash_secret(secret)


def hash_secret(secret: str) -> bytes:
    """SHA-256 of the secret's text (a 256-bit random secret needs no salt or stretching)."""
    return hashlib.sha256(secret.encode()).digest()


def parse_token(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed token, ``None`` for anything else."""
    match = _TOKEN.fullmatch(token)
    return (match.group(1), match.group(2)) if match else None


def secret_matches(secret: str, secret_hash: bytes) -> bool:
    """Whether ``secret`` hashes to ``secret_hash``, compared in constant time."""
    return hmac.compare_digest(hash_secret(secret), secret_hash)
