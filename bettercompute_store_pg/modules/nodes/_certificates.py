"""The node CA's state (``Certificates``): ``ca_keys``, ``certificates``, ``revocations`` and the instruction-signing
keys (``signing_keys``).

A key's private half is stored only as the KMS sealed it (``sealed_key``); nothing here ever sees it in the clear.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from bettercompute.errors import ConflictError, InvalidInputError
from bettercompute.modules.nodes import CaKey, IssuedCertificate, Revocation, SigningKey
from bettercompute_store_pg._db import Database, utc
from bettercompute_store_pg._repository import PgRepository

__all__ = ["PgCertificates"]

_KEY_COLUMNS = (
    "id, trust_domain, algorithm, sealed_key, certificate_pem, state, not_after, created_at, retired_at, issuer_id"
)
_CERT_COLUMNS = "serial, node_id, spiffe_id, role, ca_key_id, not_before, not_after, issued_at, key_sha256"

_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('bettercompute.modules.nodes._ca:' || :trust_domain, 0))"

_KEYS = f"""
SELECT {_KEY_COLUMNS} FROM {{s}}.ca_keys WHERE trust_domain = :trust_domain
ORDER BY created_at, issuer_id IS NOT NULL, id
"""

_ADD_KEY = """
INSERT INTO {s}.ca_keys (id, trust_domain, algorithm, sealed_key, certificate_pem, state, not_after, issuer_id)
VALUES (:id, :trust_domain, :algorithm, :sealed_key, :certificate_pem, :state, :not_after, :issuer_id)
ON CONFLICT DO NOTHING
RETURNING id
"""

_SET_STATE = """
UPDATE {s}.ca_keys SET state = :state,
    retired_at = CASE WHEN :state = 'retired' THEN coalesce(retired_at, now()) ELSE NULL END
WHERE trust_domain = :trust_domain AND id = :id
RETURNING id
"""

# Recorded only if the signing key is still the active intermediate (a rotation by another process may have committed
# since the key was read): checked by this statement, so issuing needs no read of the keys in its transaction.
_RECORD = f"""
WITH signer AS (
    SELECT 1 FROM {{s}}.ca_keys WHERE id = :ca_key_id AND state = 'active' AND issuer_id IS NOT NULL
),
recorded AS (
    INSERT INTO {{s}}.certificates ({_CERT_COLUMNS})
    SELECT :serial, :node_id, :spiffe_id, :role, :ca_key_id, :not_before, :not_after, now(), :key_sha256
    FROM signer
    ON CONFLICT DO NOTHING
    RETURNING serial
)
SELECT EXISTS (SELECT 1 FROM signer) AS active, EXISTS (SELECT 1 FROM recorded) AS recorded
"""

_GET = f"SELECT {_CERT_COLUMNS} FROM {{s}}.certificates WHERE serial = :serial"

_LIVE = """
SELECT count(*) AS n FROM {s}.certificates AS c
WHERE c.ca_key_id = :ca_key_id AND c.not_after > :now
  AND NOT EXISTS (SELECT 1 FROM {s}.revocations AS r WHERE r.serial = c.serial)
"""

_REVOKE = """
INSERT INTO {s}.revocations (serial, spiffe_id, reason)
SELECT c.serial, c.spiffe_id, :reason FROM {s}.certificates AS c
WHERE (CAST(:serial AS text) IS NULL OR c.serial = :serial)
  AND (CAST(:spiffe_id AS text) IS NULL OR c.spiffe_id = :spiffe_id)
ORDER BY c.serial
ON CONFLICT (serial) DO NOTHING
RETURNING serial, spiffe_id, reason, revoked_at
"""

_REVOKE_ISSUED_BY = """
INSERT INTO {s}.revocations (serial, spiffe_id, reason)
SELECT c.serial, c.spiffe_id, :reason FROM {s}.certificates AS c
WHERE c.ca_key_id = ANY(:ids) AND c.not_after > :now
ORDER BY c.serial
ON CONFLICT (serial) DO NOTHING
RETURNING serial, spiffe_id, reason, revoked_at
"""

_IS_REVOKED = "SELECT EXISTS (SELECT 1 FROM {s}.revocations WHERE serial = :serial) AS revoked"

# The newest certificate of an identity that is not revoked (renewal renews only that one).
_NEWEST = f"""
SELECT {_CERT_COLUMNS} FROM {{s}}.certificates AS c
WHERE c.spiffe_id = :spiffe_id AND NOT EXISTS (SELECT 1 FROM {{s}}.revocations AS r WHERE r.serial = c.serial)
ORDER BY c.issued_at DESC, c.not_after DESC LIMIT 1
"""

_LIVE_FOR = """
SELECT count(*) AS n FROM {s}.certificates AS c
WHERE c.spiffe_id = :spiffe_id AND c.not_after > :now
  AND NOT EXISTS (SELECT 1 FROM {s}.revocations AS r WHERE r.serial = c.serial)
"""

_LOCK_IDENTITY = "SELECT pg_advisory_xact_lock(hashtextextended('bettercompute.modules.nodes:' || :spiffe_id, 0))"
_LOCK_IDENTITY_SHARED = (
    "SELECT pg_advisory_xact_lock_shared(hashtextextended('bettercompute.modules.nodes:' || :spiffe_id, 0))"
)


_REVOCATIONS = """
SELECT serial, spiffe_id, reason, revoked_at FROM {s}.revocations WHERE spiffe_id = :spiffe_id
ORDER BY revoked_at, serial
"""

_SIGNING_COLUMNS = (
    "id, trust_domain, sealed_key, certificate_der, certificate_not_after, state, created_at, previous_at, retired_at"
)
_SIGNING_KEYS = (
    f"SELECT {_SIGNING_COLUMNS} FROM {{s}}.signing_keys WHERE trust_domain = :trust_domain ORDER BY created_at, id"
)
_ADD_SIGNING_KEY = """
INSERT INTO {s}.signing_keys (id, trust_domain, sealed_key, certificate_der, certificate_not_after, state)
VALUES (:id, :trust_domain, :sealed_key, :certificate_der, :certificate_not_after, :state)
ON CONFLICT DO NOTHING
RETURNING id
"""
_SET_SIGNING_KEY = """
UPDATE {s}.signing_keys SET state = coalesce(CAST(:state AS text), state),
    certificate_der = coalesce(CAST(:certificate_der AS bytea), certificate_der),
    certificate_not_after = coalesce(CAST(:not_after AS timestamptz), certificate_not_after),
    previous_at = CASE WHEN :state = 'previous' THEN coalesce(previous_at, now()) ELSE previous_at END,
    retired_at = CASE WHEN :state = 'retired' THEN coalesce(retired_at, now()) ELSE retired_at END
WHERE trust_domain = :trust_domain AND id = :id
RETURNING id
"""


def _signing_key(row: Any) -> SigningKey:
    return SigningKey(
        id=row.id,
        trust_domain=row.trust_domain,
        sealed_key=bytes(row.sealed_key),
        certificate_der=bytes(row.certificate_der),
        certificate_not_after=utc(row.certificate_not_after),
        state=row.state,
        created_at=utc(row.created_at),
        previous_at=utc(row.previous_at) if row.previous_at is not None else None,
        retired_at=utc(row.retired_at) if row.retired_at is not None else None,
    )


def _key(row: Any) -> CaKey:
    return CaKey(
        id=row.id,
        trust_domain=row.trust_domain,
        algorithm=row.algorithm,
        sealed_key=bytes(row.sealed_key),
        certificate_pem=row.certificate_pem,
        state=row.state,
        not_after=utc(row.not_after),
        created_at=utc(row.created_at),
        retired_at=utc(row.retired_at) if row.retired_at is not None else None,
        issuer_id=row.issuer_id,
    )


def _certificate(row: Any) -> IssuedCertificate:
    return IssuedCertificate(
        serial=row.serial,
        node_id=row.node_id,
        spiffe_id=row.spiffe_id,
        role=row.role,
        ca_key_id=row.ca_key_id,
        not_before=utc(row.not_before),
        not_after=utc(row.not_after),
        issued_at=utc(row.issued_at),
        key_sha256=row.key_sha256,
    )


def _revocation(row: Any) -> Revocation:
    return Revocation(serial=row.serial, spiffe_id=row.spiffe_id, reason=row.reason, revoked_at=utc(row.revoked_at))


class PgCertificates(PgRepository):
    """``Certificates`` on ``ca_keys``, ``certificates`` and ``revocations``."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._lock = db.sql(_LOCK)
        self._keys = db.sql(_KEYS)
        self._add_key = db.sql(_ADD_KEY)
        self._set_state = db.sql(_SET_STATE)
        self._record = db.sql(_RECORD)
        self._get = db.sql(_GET)
        self._live = db.sql(_LIVE)
        self._revoke = db.sql(_REVOKE)
        self._revoke_issued_by = db.sql(_REVOKE_ISSUED_BY)
        self._is_revoked = db.sql(_IS_REVOKED)
        self._newest = db.sql(_NEWEST)
        self._live_for = db.sql(_LIVE_FOR)
        self._lock_identity = db.sql(_LOCK_IDENTITY)
        self._lock_identity_shared = db.sql(_LOCK_IDENTITY_SHARED)
        self._revocations = db.sql(_REVOCATIONS)
        self._signing_keys = db.sql(_SIGNING_KEYS)
        self._add_signing_key = db.sql(_ADD_SIGNING_KEY)
        self._set_signing_key = db.sql(_SET_SIGNING_KEY)

    async def lock(self, trust_domain: str) -> None:
        """Take the trust domain's transaction-scoped advisory lock."""
        await self._fetch_in_transaction("lock", self._lock, {"trust_domain": trust_domain})

    async def keys(self, trust_domain: str) -> list[CaKey]:
        """The trust domain's keys, oldest first."""
        return [_key(row) for row in await self._fetch(self._keys, {"trust_domain": trust_domain})]

    async def add_key(self, key: CaKey) -> None:
        """Add a key; a second active root or intermediate of a trust domain, or a taken id: ``ConflictError``."""
        params = {
            "id": key.id,
            "trust_domain": key.trust_domain,
            "algorithm": key.algorithm,
            "sealed_key": key.sealed_key,
            "certificate_pem": key.certificate_pem,
            "state": key.state,
            "not_after": key.not_after,
            "issuer_id": key.issuer_id,
        }
        if not await self._fetch_in_transaction("add_key", self._add_key, params):
            raise ConflictError("the trust domain has an active CA key of this kind already, or the key id is taken")

    async def set_key_state(self, *, trust_domain: str, id: str, state: str) -> bool:
        """Move a key to ``state``."""
        params = {"trust_domain": trust_domain, "id": id, "state": state}
        return bool(await self._fetch_in_transaction("set_key_state", self._set_state, params))

    async def signing_keys(self, trust_domain: str) -> list[SigningKey]:
        """The trust domain's instruction-signing keys, oldest first."""
        return [_signing_key(r) for r in await self._fetch(self._signing_keys, {"trust_domain": trust_domain})]

    async def add_signing_key(self, key: SigningKey) -> None:
        """Add an instruction-signing key; a second active one (or a taken id) is a ``ConflictError``."""
        params = {
            "id": key.id,
            "trust_domain": key.trust_domain,
            "sealed_key": key.sealed_key,
            "certificate_der": key.certificate_der,
            "certificate_not_after": key.certificate_not_after,
            "state": key.state,
        }
        if not await self._fetch_in_transaction("add_signing_key", self._add_signing_key, params):
            raise ConflictError("the trust domain has an active signing key already, or the key id is taken")

    async def set_signing_key(
        self,
        *,
        trust_domain: str,
        id: str,
        state: str | None = None,
        certificate: tuple[bytes, dt.datetime] | None = None,
    ) -> bool:
        """Change a signing key's state and/or certificate."""
        params = {
            "trust_domain": trust_domain,
            "id": id,
            "state": state,
            "certificate_der": certificate[0] if certificate is not None else None,
            "not_after": certificate[1] if certificate is not None else None,
        }
        return bool(await self._fetch_in_transaction("set_signing_key", self._set_signing_key, params))

    async def record(self, certificate: IssuedCertificate) -> bool:
        """Record an issued certificate if its CA key is still the active one; ``False`` (nothing recorded) if not."""
        params = {
            "serial": certificate.serial,
            "node_id": certificate.node_id,
            "spiffe_id": certificate.spiffe_id,
            "role": certificate.role,
            "ca_key_id": certificate.ca_key_id,
            "not_before": certificate.not_before,
            "not_after": certificate.not_after,
            "key_sha256": certificate.key_sha256,
        }
        row = (await self._fetch_in_transaction("record", self._record, params))[0]
        if not row.active:
            return False
        if not row.recorded:
            raise ConflictError("a certificate with this serial is recorded already")
        return True

    async def get(self, serial: str) -> IssuedCertificate | None:
        """The issued certificate ``serial``, or ``None``."""
        rows = await self._fetch(self._get, {"serial": serial})
        return _certificate(rows[0]) if rows else None

    async def live_count(self, ca_key_id: str, *, now: dt.datetime) -> int:
        """Unexpired, unrevoked certificates issued under ``ca_key_id``."""
        rows = await self._fetch(self._live, {"ca_key_id": ca_key_id, "now": now})
        return int(rows[0].n)

    async def live_count_for(self, spiffe_id: str, *, now: dt.datetime) -> int:
        """Unexpired, unrevoked certificates of ``spiffe_id``."""
        rows = await self._fetch(self._live_for, {"spiffe_id": spiffe_id, "now": now})
        return int(rows[0].n)

    async def newest(self, spiffe_id: str) -> IssuedCertificate | None:
        """The most recently issued unrevoked certificate of ``spiffe_id``."""
        rows = await self._fetch(self._newest, {"spiffe_id": spiffe_id})
        return _certificate(rows[0]) if rows else None

    async def lock_identity(self, spiffe_id: str, *, shared: bool) -> None:
        """Hold ``spiffe_id``'s identity lock until the transaction ends: shared while renewing, exclusive while
        revoking."""
        statement = self._lock_identity_shared if shared else self._lock_identity
        await self._fetch_in_transaction("lock_identity", statement, {"spiffe_id": spiffe_id})

    async def revoke(self, *, serial: str | None = None, spiffe_id: str | None = None, reason: str) -> list[Revocation]:
        """Revoke one certificate by serial, or all of a SPIFFE ID's; returns the revocations added."""
        if (serial is None) == (spiffe_id is None):
            raise InvalidInputError("revoke takes a serial or a SPIFFE ID")
        params = {"serial": serial, "spiffe_id": spiffe_id, "reason": reason}
        return [_revocation(row) for row in await self._fetch_in_transaction("revoke", self._revoke, params)]

    async def revoke_issued_by(self, ca_key_ids: Sequence[str], *, now: dt.datetime, reason: str) -> list[Revocation]:
        """Revoke the unexpired certificates of these CA keys; returns the revocations added."""
        params = {"ids": list(ca_key_ids), "now": now, "reason": reason}
        rows = await self._fetch_in_transaction("revoke_issued_by", self._revoke_issued_by, params)
        return [_revocation(row) for row in rows]

    async def is_revoked(self, serial: str) -> bool:
        """Whether ``serial`` is revoked."""
        rows = await self._fetch(self._is_revoked, {"serial": serial})
        return bool(rows[0].revoked)

    async def revocations(self, spiffe_id: str) -> list[Revocation]:
        """The revocations of ``spiffe_id``'s certificates, oldest first."""
        return [_revocation(row) for row in await self._fetch(self._revocations, {"spiffe_id": spiffe_id})]
