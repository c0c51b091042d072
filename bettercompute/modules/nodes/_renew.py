"""Certificate renewal with proof of possession: a challenge for the presented certificate, then the node's
signature over it and the new CSR, checked again under the node's and the identity's locks."""

from __future__ import annotations

import datetime as dt
import logging

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.verification import PolicyBuilder, VerificationError
from cryptography.x509.verification import Store as TrustStore

from bettercompute.errors import (
    AccessDeniedError,
    FailedPreconditionError,
    InvalidInputError,
    UnauthenticatedError,
)
from bettercompute.modules.nodes._ca import CertificateAuthority
from bettercompute.modules.nodes._port import CERTIFICATES, NODES, IssuedCertificate, NodeRecord
from bettercompute.modules.nodes._proofs import (
    ChallengeIssuer,
    renew_message,
    verify_signature,
)
from bettercompute.modules.nodes._x509 import checked_csr_key, key_sha256
from bettercompute.ports import AuditRecord, Clock, ReplayGuard, Store, Transaction

__all__ = ["CHALLENGE_TTL", "CLOCK_SKEW", "NODE", "RENEW_ACTION", "Presented", "RenewResult", "Renewals", "ms"]

log = logging.getLogger("bettercompute.joins")

RENEW_ACTION = "compute:nodes:renew"
NODE = "node"
CHALLENGE_TTL = dt.timedelta(minutes=2)
CLOCK_SKEW = dt.timedelta(minutes=1)
"""How far a signed time may lie in the future (the node's clock running ahead)."""
_MAX_CERT_BYTES = 16 * 1024


def ms(at: dt.datetime) -> int:
    return int(at.timestamp() * 1000)


@attrs.frozen(kw_only=True)
class RenewResult:
    """A renewed certificate (the old one stays valid until it expires)."""

    node_id: str
    spiffe_id: str
    certificate_pem: str
    chain_pem: str
    trust_bundle_pem: str
    serial: str
    not_after: dt.datetime


@attrs.frozen(kw_only=True)
class Presented:
    record: IssuedCertificate
    certificate: x509.Certificate
    node: NodeRecord


class Renewals:
    """JoinService's renewals: ``renew_challenge``, ``renew``, and ``node_of`` for a presented certificate."""

    def __init__(
        self,
        *,
        store: Store,
        ca: CertificateAuthority,
        challenges: ChallengeIssuer,
        replay_guard: ReplayGuard,
        clock: Clock,
        certificate_ttl: dt.timedelta | None = None,
    ) -> None:
        self._store = store
        self.ca = ca
        self._challenges = challenges
        self._guard = replay_guard
        self._clock = clock
        self._ttl = certificate_ttl

    async def renew_challenge(self, *, certificate_pem: str) -> bytes:
        """A fresh challenge for renewing ``certificate_pem`` (valid for two minutes, usable once).

        Raises:
            InvalidInputError: not a PEM certificate.
            UnauthenticatedError: the certificate is expired (``certificate_expired``: re-join instead), untrusted
                or revoked.
            AccessDeniedError: its node is retired.
        """
        presented = await self.presented(certificate_pem)
        await self._challenges.refresh()
        return self._challenges.issue(presented.record.serial, now_ms=ms(self._clock.now()))

    async def renew(self, *, certificate_pem: str, challenge: bytes, signature: bytes, csr_pem: str) -> RenewResult:
        """A new certificate for the node of ``certificate_pem``, for the key of ``csr_pem``.

        Only the node's newest certificate renews (so a key the node rotated away from is dead once it expires);
        a renewal retried with the same new key after its answer was lost is answered again.

        Raises:
            InvalidInputError: a malformed certificate, challenge, signature or CSR.
            UnauthenticatedError: the certificate is expired, untrusted, revoked or superseded; the challenge was
                not issued for it, is older than two minutes or was used; the signature is not by the
                certificate's key over the challenge and the CSR (``bad_signature``).
            AccessDeniedError: the node is retired.
            UnavailableError: the CA key changed during the renewal (retry).
        """
        presented = await self.presented(certificate_pem)
        await self._challenges.refresh()
        issued_ms, nonce = self._challenges.open(challenge, presented.record.serial)
        now = self._clock.now()
        issued_at = dt.datetime.fromtimestamp(issued_ms / 1000, dt.UTC)
        if issued_at < now - CHALLENGE_TTL or issued_at > now + CLOCK_SKEW:
            raise UnauthenticatedError(
                "the challenge is too old; ask for a new one", details={"reason": "challenge_expired"}
            )
        csr_key = checked_csr_key(csr_pem)
        csr_der = x509.load_pem_x509_csr(csr_pem.encode()).public_bytes(serialization.Encoding.DER)
        verify_signature(presented.certificate.public_key(), signature, renew_message(challenge, csr_der))
        if not await self._guard.first_use(
            "renew/v1", nonce, expires_at=issued_at + CHALLENGE_TTL + CLOCK_SKEW, now=now
        ):
            raise UnauthenticatedError("this challenge was already used", details={"reason": "replayed"})
        await self.ca.prepare()
        bundle_pem = await self.ca.trust_bundle_pem()
        node = presented.node
        spiffe_id = presented.record.spiffe_id
        async with self._store.transaction() as tx:
            # Checked again under the node's row lock (a reclaim or a retirement holds it exclusively) and the
            # identity's shared lock (a revocation holds it exclusively): whichever commits first, the other sees it.
            current = await tx.repository(NODES).get(node.id, lock=True)
            await tx.repository(CERTIFICATES).lock_identity(spiffe_id, shared=True)
            if current is None or current.state == "retired":
                raise AccessDeniedError("the node is retired", details={"reason": "node_retired"})
            if await tx.repository(CERTIFICATES).is_revoked(presented.record.serial):
                raise UnauthenticatedError("the certificate was revoked", details={"reason": "certificate_revoked"})
            await self._check_newest(tx, presented, csr_key_digest=key_sha256(csr_key))
            issued = await self.ca.issue_in(
                tx, csr_pem, node_id=node.id, role="node", ttl=self._ttl, checked_key=csr_key
            )
            await tx.audit(
                AuditRecord(
                    action=RENEW_ACTION,
                    actor=f"node:{node.id}",
                    tenant=node.tenant,
                    resource_type=NODE,
                    resource_id=node.id,
                    decision_id=None,
                    outcome="ok",
                    details={"previous_serial": presented.record.serial, "serial": issued.serial},
                )
            )
        log.info("node %s renewed its certificate", node.id)
        return RenewResult(
            node_id=node.id,
            spiffe_id=issued.spiffe_id,
            certificate_pem=issued.certificate_pem,
            chain_pem=issued.chain_pem,
            trust_bundle_pem=bundle_pem,
            serial=issued.serial,
            not_after=issued.not_after,
        )

    async def _check_newest(self, tx: Transaction, presented: Presented, *, csr_key_digest: str) -> None:
        """Only the newest certificate renews, unless the CSR asks again for the newest one's key (a renewal whose
        answer was lost: the CSR proves possession of that key)."""
        newest = await tx.repository(CERTIFICATES).newest(presented.record.spiffe_id)
        if newest is not None and newest.serial != presented.record.serial and newest.key_sha256 != csr_key_digest:
            raise UnauthenticatedError(
                "a newer certificate of this node exists: renew that one", details={"reason": "superseded"}
            )

    async def node_of(self, certificate_pem: str) -> NodeRecord:
        """The live node a presented certificate belongs to (checked as for renewal)."""
        return (await self.presented(certificate_pem)).node

    async def verified(self, certificate_pem: str) -> tuple[IssuedCertificate, x509.Certificate]:
        """A presented certificate of any role, checked: it parses, has not expired, chains to the trust bundle, was
        issued by this CA and is not revoked.

        Raises:
            InvalidInputError: it is not a PEM certificate.
            UnauthenticatedError: it has expired (``certificate_expired``), is not this CA's (``untrusted``) or was
                revoked (``certificate_revoked``).
        """
        if not isinstance(certificate_pem, str) or len(certificate_pem) > _MAX_CERT_BYTES:
            raise InvalidInputError("certificate: expected a PEM certificate", details={"path": "certificate"})
        try:
            certificate = x509.load_pem_x509_certificate(certificate_pem.encode())
        except ValueError:
            raise InvalidInputError(
                "certificate: expected a PEM certificate", details={"path": "certificate"}
            ) from None
        now = self._clock.now()
        if certificate.not_valid_after_utc <= now:
            raise UnauthenticatedError(
                "the certificate has expired and cannot be renewed: join again with a token whose reclaim is"
                " same-hardware to get this node back",
                details={"reason": "certificate_expired"},
            )
        bundle = await self.ca.trust_bundle()
        intermediates = await self.ca.intermediates()
        try:
            verifier = PolicyBuilder().store(TrustStore(bundle)).time(now).build_client_verifier()
            verifier.verify(certificate, intermediates)
        except VerificationError:
            raise UnauthenticatedError(
                "the certificate does not chain to this control plane's CA", details={"reason": "untrusted"}
            ) from None
        serial = format(certificate.serial_number, "x")
        record = await self._store.repository(CERTIFICATES).get(serial)
        if record is None:
            raise UnauthenticatedError(
                "the certificate was not issued by this control plane's CA", details={"reason": "untrusted"}
            )
        if await self._store.repository(CERTIFICATES).is_revoked(serial):
            raise UnauthenticatedError("the certificate was revoked", details={"reason": "certificate_revoked"})
        return record, certificate

    async def presented(self, certificate_pem: str) -> Presented:
        """A presented node certificate, checked as ``verified`` does, whose node is live.

        Raises:
            FailedPreconditionError: it is a ``site`` or ``ramdisk`` certificate (``role``).
            AccessDeniedError: its node is retired.
        """
        record, certificate = await self.verified(certificate_pem)
        if record.role != "node":
            raise FailedPreconditionError(
                f"{record.role} certificates are not renewed here", details={"reason": "role", "role": record.role}
            )
        node = await self._store.repository(NODES).get(record.node_id)
        if node is None or node.state == "retired":
            raise AccessDeniedError(
                "the node is retired", details={"reason": "node_retired", "node_id": record.node_id}
            )
        return Presented(record=record, certificate=certificate, node=node)
