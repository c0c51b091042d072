"""The node CA's keys, the certificates it issued and their revocations."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

import attrs

from bettercompute.ports.transaction import Transaction

__all__ = ["CaKey", "Certificates", "IssuedCertificate", "Revocation"]


@attrs.frozen(kw_only=True, repr=False)
class CaKey:
    """One signing key of the node CA of ``trust_domain``.

    ``sealed_key`` is the private key (PKCS#8 DER) as the KMS sealed it (context ``ca:<trust_domain>:<id>``), never
    in the clear; ``certificate_pem`` its self-signed CA certificate. ``state`` is ``active`` (signs; exactly one per
    trust domain), ``previous`` (signs no more, still in the trust bundle) or ``retired`` (out of the bundle).
    """

    id: str
    trust_domain: str
    algorithm: str
    sealed_key: bytes
    certificate_pem: str
    state: str
    not_after: dt.datetime
    created_at: dt.datetime
    retired_at: dt.datetime | None = None

    def __repr__(self) -> str:
        return f"CaKey(id={self.id!r}, trust_domain={self.trust_domain!r}, state={self.state!r})"


@attrs.frozen(kw_only=True)
class IssuedCertificate:
    """A certificate the CA issued: ``serial`` is the serial number in lower-case hex (no leading zeros)."""

    serial: str
    node_id: str
    spiffe_id: str
    role: str
    ca_key_id: str
    not_before: dt.datetime
    not_after: dt.datetime
    issued_at: dt.datetime | None = None
    key_sha256: str | None = None
    """SHA-256 (hex) of the certified public key (SubjectPublicKeyInfo, DER)."""


@attrs.frozen(kw_only=True)
class Revocation:
    """The revocation of one issued certificate."""

    serial: str
    spiffe_id: str
    reason: str
    revoked_at: dt.datetime


class Certificates(Protocol):
    """The node CA's state: its signing keys (sealed), the certificates it issued, and their revocations.

    Writes given a ``tx`` commit with it. ``lock`` serializes the key changes of one trust domain.
    """

    async def lock(self, tx: Transaction, trust_domain: str) -> None:
        """Hold the trust domain's key lock until ``tx`` ends (creating, rotating and retiring keys take it)."""
        ...

    async def keys(self, trust_domain: str, *, tx: Transaction | None = None) -> list[CaKey]:
        """The trust domain's keys, retired ones included, oldest first (read in ``tx`` when given)."""
        ...

    async def add_key(self, tx: Transaction, key: CaKey) -> None:
        """Add a key (its ``created_at`` is the store's now). ``ConflictError`` for a second active key."""
        ...

    async def set_key_state(self, tx: Transaction, *, trust_domain: str, id: str, state: str) -> bool:
        """Move a key to ``state`` (``retired`` stamps ``retired_at``); ``False`` when there is no such key."""
        ...

    async def record(self, tx: Transaction, certificate: IssuedCertificate) -> None:
        """Record an issued certificate. ``ConflictError`` if its serial is recorded already."""
        ...

    async def get(self, serial: str, *, tx: Transaction | None = None) -> IssuedCertificate | None:
        """The issued certificate with this serial, or ``None``."""
        ...

    async def live_count(self, ca_key_id: str, *, now: dt.datetime, tx: Transaction | None = None) -> int:
        """How many certificates issued under ``ca_key_id`` are unexpired at ``now`` and not revoked."""
        ...

    async def live_count_for(self, spiffe_id: str, *, now: dt.datetime, tx: Transaction | None = None) -> int:
        """How many certificates of ``spiffe_id`` are unexpired at ``now`` and not revoked."""
        ...

    async def newest(self, spiffe_id: str, *, tx: Transaction | None = None) -> IssuedCertificate | None:
        """The most recently issued certificate of ``spiffe_id`` that is not revoked, or ``None``."""
        ...

    async def lock_identity(self, tx: Transaction, spiffe_id: str, *, shared: bool) -> None:
        """Hold the identity lock of ``spiffe_id`` until ``tx`` ends: shared while a renewal checks and issues,
        exclusive while a revocation writes, so neither misses the other."""
        ...

    async def revoke(
        self, tx: Transaction, *, serial: str | None = None, spiffe_id: str | None = None, reason: str
    ) -> list[Revocation]:
        """Revoke the certificate ``serial``, or every certificate of ``spiffe_id`` (exactly one of them given).

        Returns the revocations this call added (a certificate revoked before is left as it was).
        """
        ...

    async def is_revoked(self, serial: str, *, tx: Transaction | None = None) -> bool:
        """Whether the certificate ``serial`` is revoked."""
        ...

    async def revocations(self, spiffe_id: str) -> list[Revocation]:
        """The revocations of ``spiffe_id``'s certificates, oldest first."""
        ...
