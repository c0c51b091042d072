"""JoinService (join, renewal, retirement) and ``GatewayServices`` (what the gateway relays to).

No step calls IAM: a join is authorized by its token, a renewal and a secret request by the node's certificate and
a signature by its key. The gateway relaying them is not trusted: the sealed token is bound to the CSR, claims,
evidence and pool it was sealed with; renewals and secret requests are signed by the node over everything the
answer depends on.

Join, in order (nothing is written until every check passed; the node, its certificate record and the token's use
commit in one transaction, and nothing in it calls out):

1. Check the CSR (parses, its signature matches its key, asks for no name of its own).
2. Unseal the token (HPKE to JoinService's key, fresh, never seen before), check its binding, parse it.
3. Find the token by id and secret hash; refuse it revoked, expired, exhausted or for another pool; decode the
   claims.
4. Run the attestor chain (the built-in ``claims`` attestor enforcing the token's ``expect`` first, then
   ``Options.attestors``), outside any transaction: an attestor may call out. Load the CA key.
5. In one transaction: enroll the node as ``adopting`` by its hardware key (a new node, or with ``reclaim:
   same-hardware`` the pool's live node with the same key, whose certificates are then revoked; while that node
   still holds a valid certificate only a token naming the serial, or an attestor's facts, may take it); sign and
   record its 24-hour certificate; project it; spend a use of the token last (atomic: of two joins racing for the
   last use, one wins); audit it and publish ``node.joined``.

Renewal needs the node's newest certificate (valid, chaining to the trust bundle, not revoked, its node not
retired), a challenge from ``renew_challenge`` for that certificate, not used before, at most two minutes old, and
the certificate key's signature over the challenge and the new CSR. It is checked again, and the certificate
issued, under the node's row lock and the identity's shared lock, so a concurrent reclaim, retirement or
revocation is never outlived. A certificate that expired cannot be renewed: the machine joins again with a token
whose ``reclaim`` is ``same-hardware`` and gets its node id back (see the README).
"""

from __future__ import annotations

import datetime as dt
import hmac
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.verification import PolicyBuilder, VerificationError
from cryptography.x509.verification import Store as TrustStore
from joserfc.errors import JoseError
from joserfc.jwk import JWKRegistry

from bettercompute._runtime.codec import decode
from bettercompute.errors import (
    AccessDeniedError,
    ComputeError,
    ConflictError,
    FailedPreconditionError,
    InternalError,
    InvalidInputError,
    UnauthenticatedError,
)
from bettercompute.modules.nodes._ca import CertificateAuthority, checked_csr_key, key_sha256
from bettercompute.modules.nodes._claims import (
    AttestationRequest,
    Attestor,
    HardwareClaims,
    chain,
    checked_evidence,
    hardware_key,
)
from bettercompute.modules.nodes._nodes import retire_node
from bettercompute.modules.nodes._proofs import (
    BINDING_BYTES,
    ChallengeIssuer,
    join_binding,
    renew_message,
    secret_message,
    verify_signature,
)
from bettercompute.modules.nodes._sealing import Unsealer
from bettercompute.modules.nodes._tokens import hash_secret, parse_token
from bettercompute.modules.secrets import NodeIdentity, SecretBroker
from bettercompute.modules.secrets._broker import RELEASE_ACTION
from bettercompute.ports import (
    AuditRecord,
    Clock,
    IssuedCertificate,
    NodeRecord,
    OutboxEvent,
    ReplayGuard,
    ResourceRef,
    Store,
    Transaction,
)

__all__ = ["GatewayServices", "JoinResult", "JoinService", "RenewResult"]

log = logging.getLogger("bettercompute.joins")

JOIN_ACTION = "compute:nodes:join"
RENEW_ACTION = "compute:nodes:renew"
JOINED_EVENT = "node.joined"
NODE = "node"
CHALLENGE_TTL = dt.timedelta(minutes=2)
SECRET_REQUEST_TTL = dt.timedelta(minutes=2)
_SKEW = dt.timedelta(minutes=1)
_POOL_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_MAX_CERT_BYTES = 16 * 1024


def _ms(at: dt.datetime) -> int:
    return int(at.timestamp() * 1000)


@attrs.frozen(kw_only=True)
class _ClaimsInput:
    claims: HardwareClaims


@attrs.frozen(kw_only=True)
class JoinResult:
    """A joined node's identity: its id, its certificate and the chain and trust bundle to use with it."""

    node_id: str
    tenant: str
    pool_id: str
    spiffe_id: str
    certificate_pem: str
    chain_pem: str
    trust_bundle_pem: str
    serial: str
    not_after: dt.datetime
    reclaimed: bool


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
class _Presented:
    record: IssuedCertificate
    certificate: x509.Certificate
    node: NodeRecord


class JoinService:
    """Joins machines to pools and renews their certificates. Made by the control plane at ``initialize()`` when
    ``Options.join`` and ``Options.kms`` are set; reach it through ``compute.gateway_services``.

    Args:
        store: The store.
        ca: The node CA of the trust domain.
        unsealer: Opens sealed join tokens (JoinService's key pair and the shared replay guard).
        challenges: Issues and checks renewal challenges.
        replay_guard: Remembers used renewal challenges and secret-request nonces (shared by every process).
        clock: The control plane's clock.
        attestors: The host's attestors, run after the built-in ``claims`` attestor.
        sealed_token_max_age: How old a sealed token may be.
    """

    def __init__(
        self,
        *,
        store: Store,
        ca: CertificateAuthority,
        unsealer: Unsealer,
        challenges: ChallengeIssuer,
        replay_guard: ReplayGuard,
        clock: Clock,
        attestors: Sequence[Attestor] = (),
        sealed_token_max_age: dt.timedelta = dt.timedelta(minutes=5),
    ) -> None:
        self._store = store
        self.ca = ca
        self._unsealer = unsealer
        self._challenges = challenges
        self._guard = replay_guard
        self._clock = clock
        self._attestors = chain(attestors)
        self._max_age = sealed_token_max_age

    def __repr__(self) -> str:
        return f"JoinService(trust_domain={self.ca.trust_domain!r})"

    # --- join -------------------------------------------------------------------------------------------------

    async def join(
        self,
        *,
        sealed_token: bytes,
        csr_pem: str,
        claims: Mapping[str, Any],
        evidence: Mapping[str, Any] | None = None,
        pool_id: str | None = None,
    ) -> JoinResult:
        """Join a machine: see the module docstring for the steps.

        Raises:
            InvalidInputError: a malformed sealed payload, token, CSR (also one whose signature does not match its
                key, or that asks for a SAN), claims, evidence or pool id.
            UnauthenticatedError: the payload does not open, is stale or replayed, or was sealed for another CSR,
                other claims or another pool (``binding_mismatch``); the token is unknown, revoked, expired or
                exhausted (``details["reason"]`` says which).
            AccessDeniedError: the token is for another pool (``wrong_pool``), or the claims violate its ``expect``
                (``expect_mismatch``), or another attestor refused.
            FailedPreconditionError: the pool's class takes no daemons (``provider``).
            ConflictError: the pool has a live node with this hardware key and the token does not reclaim
                (``hardware_taken``), or the node to reclaim still holds a valid certificate and nothing but the
                claims says this is the same machine (``node_live``).
            UnavailableError: the CA key changed during the join (retry).
        """
        if not isinstance(sealed_token, bytes):
            raise InvalidInputError("sealed_token: expected bytes", details={"path": "sealed_token"})
        if pool_id is not None and not (isinstance(pool_id, str) and _POOL_ID.fullmatch(pool_id)):
            raise InvalidInputError("pool_id: not a pool id", details={"path": "pool_id"})
        csr_key = checked_csr_key(csr_pem)
        csr_der = x509.load_pem_x509_csr(csr_pem.encode()).public_bytes(serialization.Encoding.DER)
        binding = join_binding(csr_der, claims, evidence, pool_id)
        now = self._clock.now()
        unsealed = await self._unsealer.unseal(sealed_token, now=now, max_age=self._max_age)
        if len(unsealed.plaintext) < BINDING_BYTES or not hmac.compare_digest(
            unsealed.plaintext[:BINDING_BYTES], binding
        ):
            raise UnauthenticatedError(
                "the sealed token was sealed for another CSR, other claims or another pool",
                details={"reason": "binding_mismatch"},
            )
        try:
            parsed = parse_token(unsealed.plaintext[BINDING_BYTES:].decode())
        except UnicodeDecodeError:
            parsed = None
        if parsed is None:
            raise InvalidInputError(
                "the sealed payload is not a join token (bcjt_<id>.<secret>)",
                details={"path": "sealed_token", "reason": "malformed_token"},
            )
        token_id, secret = parsed
        secret_hash = hash_secret(secret)
        token = await self._store.join_tokens.matching(token_id, secret_hash=secret_hash)
        if token is None:
            raise UnauthenticatedError("the join token is not valid", details={"reason": "unknown_token"})
        _refuse_spent(token.revoked_at is not None, token.expires_at <= now, token.uses_left <= 0)
        if pool_id is not None and pool_id != token.pool_id:
            raise AccessDeniedError(
                "the join token is for another pool than the one this machine is pinned to",
                details={"reason": "wrong_pool", "pool_id": pool_id},
            )
        hardware = _claims(claims)
        facts = checked_evidence(evidence)
        pool = await self._store.pools.get(token.pool_id)
        if pool is None:  # pragma: no cover - a token's pool cannot be deleted
            raise InternalError("the join token's pool is missing")
        if pool.pool_class == "provider":
            raise FailedPreconditionError(
                "a provider pool takes no daemons: its machines are run through the provider's API",
                details={"reason": "pool_class", "pool_class": pool.pool_class},
            )
        request = AttestationRequest(
            claims=hardware, evidence=facts, token=token, pool=pool, csr_key_sha256=key_sha256(csr_key)
        )
        attestation = await self._attest(request)
        hw_key = hardware_key(hardware)
        # Everything that may call out happens before the transaction: the CA key is loaded from the KMS, the
        # trust bundle read. The transaction itself only reads and writes the database.
        await self.ca.prepare()
        bundle_pem = await self.ca.trust_bundle_pem()
        vouched = "serial" in token.expect or bool(attestation)
        async with self._store.transaction() as tx:
            enrollment = await self._store.nodes.enroll(
                tx,
                new_id=f"node_{secrets.token_hex(8)}",
                pool_id=pool.id,
                tenant=pool.tenant,
                hardware_key=hw_key,
                claims=attrs.asdict(hardware, recurse=True),
                attestation=attestation,
                join_token_id=token_id,
                reclaim=token.reclaim == "same-hardware",
            )
            node = enrollment.node
            if enrollment.outcome == "conflict":
                raise ConflictError(
                    "this pool has a node with the same hardware; retire it (nodes.retire), or join with a token whose"
                    " reclaim is same-hardware",
                    details={"reason": "hardware_taken"},
                )
            reclaimed = enrollment.outcome == "reclaimed"
            spiffe_id = self.ca.spiffe_id(node.id)
            if reclaimed:
                # Claims alone do not prove it is the same machine: while the node still holds a valid certificate
                # (it may be up and running), only a token that names the serial or an attestor may take it back.
                live = await self._store.certificates.live_count_for(spiffe_id, now=now, tx=tx)
                if live and not vouched:
                    raise ConflictError(
                        "the node with this hardware still holds a valid certificate: revoke it (nodes.revoke) or"
                        " retire it (nodes.retire) first, or join with a token whose expect names the serial",
                        details={"reason": "node_live"},
                    )
                await self.ca.revoke_spiffe_id(spiffe_id, reason="reclaimed by a new join of the same hardware", tx=tx)
            issued = await self.ca.issue(csr_pem, node_id=node.id, role="node", tx=tx)
            await tx.project(ResourceRef(type=NODE, id=node.id, tenant=node.tenant, pool=node.pool_id))
            # The token's row stays locked from here to the commit: spend the use last, so joins sharing a token
            # wait for each other as briefly as possible.
            spent = await self._store.join_tokens.consume(tx, id=token_id, secret_hash=secret_hash, now=now)
            if spent.outcome != "consumed":
                _refuse_spent(spent.outcome == "revoked", spent.outcome == "expired", spent.outcome == "exhausted")
                raise UnauthenticatedError("the join token is not valid", details={"reason": "unknown_token"})
            await tx.audit(
                AuditRecord(
                    action=JOIN_ACTION,
                    actor=f"join-token:{token_id}",
                    tenant=node.tenant,
                    resource_type=NODE,
                    resource_id=node.id,
                    decision_id=None,
                    outcome="ok",
                    details={
                        "pool_id": node.pool_id,
                        "reclaimed": reclaimed,
                        "serial": issued.serial,
                        "hardware_key": hw_key,
                        "uses_left": spent.token.uses_left if spent.token else None,
                    },
                )
            )
            await tx.publish(
                [
                    OutboxEvent(
                        type=JOINED_EVENT,
                        key=node.id,
                        payload={
                            "node_id": node.id,
                            "tenant": node.tenant,
                            "pool_id": node.pool_id,
                            "reclaimed": reclaimed,
                            "enrollments": node.enrollments,
                        },
                    )
                ]
            )
        log.info("node %s joined pool %s (%s)", node.id, node.pool_id, "reclaimed" if reclaimed else "new")
        return JoinResult(
            node_id=node.id,
            tenant=node.tenant,
            pool_id=node.pool_id,
            spiffe_id=issued.spiffe_id,
            certificate_pem=issued.certificate_pem,
            chain_pem=issued.chain_pem,
            trust_bundle_pem=bundle_pem,
            serial=issued.serial,
            not_after=issued.not_after,
            reclaimed=reclaimed,
        )

    async def _attest(self, request: AttestationRequest) -> dict[str, str]:
        facts: dict[str, str] = {}
        for attestor in self._attestors:
            try:
                found = await attestor.attest(request)
            except ComputeError:
                raise
            except Exception as exc:
                log.error("attestor %s failed: %s", attestor.name, type(exc).__name__)
                raise InternalError(f"the attestor {attestor.name!r} failed") from None
            for key, value in dict(found).items():
                facts[f"{attestor.name}.{key}"] = str(value)
        return facts

    # --- renewal ----------------------------------------------------------------------------------------------

    async def renew_challenge(self, *, certificate_pem: str) -> bytes:
        """A fresh challenge for renewing ``certificate_pem`` (valid for two minutes, usable once).

        Raises:
            InvalidInputError: not a PEM certificate.
            UnauthenticatedError: the certificate is expired (``certificate_expired``: re-join instead), untrusted
                or revoked.
            AccessDeniedError: its node is retired.
        """
        presented = await self._presented(certificate_pem)
        return self._challenges.issue(presented.record.serial, now_ms=_ms(self._clock.now()))

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
        presented = await self._presented(certificate_pem)
        issued_ms, nonce = self._challenges.open(challenge, presented.record.serial)
        now = self._clock.now()
        issued_at = dt.datetime.fromtimestamp(issued_ms / 1000, dt.UTC)
        if issued_at < now - CHALLENGE_TTL or issued_at > now + _SKEW:
            raise UnauthenticatedError(
                "the challenge is too old; ask for a new one", details={"reason": "challenge_expired"}
            )
        csr_key = checked_csr_key(csr_pem)
        csr_der = x509.load_pem_x509_csr(csr_pem.encode()).public_bytes(serialization.Encoding.DER)
        verify_signature(presented.certificate.public_key(), signature, renew_message(challenge, csr_der))
        if not await self._guard.first_use("renew/v1", nonce, expires_at=issued_at + CHALLENGE_TTL + _SKEW, now=now):
            raise UnauthenticatedError("this challenge was already used", details={"reason": "replayed"})
        await self.ca.prepare()
        bundle_pem = await self.ca.trust_bundle_pem()
        node = presented.node
        spiffe_id = presented.record.spiffe_id
        async with self._store.transaction() as tx:
            # Checked again under the node's row lock (a reclaim or a retirement holds it exclusively) and the
            # identity's shared lock (a revocation holds it exclusively): whichever commits first, the other sees it.
            current = await self._store.nodes.get(node.id, tx=tx, lock=True)
            await self._store.certificates.lock_identity(tx, spiffe_id, shared=True)
            if current is None or current.state == "retired":
                raise AccessDeniedError("the node is retired", details={"reason": "node_retired"})
            if await self._store.certificates.is_revoked(presented.record.serial, tx=tx):
                raise UnauthenticatedError("the certificate was revoked", details={"reason": "certificate_revoked"})
            await self._check_newest(presented, csr_key_digest=key_sha256(csr_key), tx=tx)
            issued = await self.ca.issue(csr_pem, node_id=node.id, role="node", tx=tx)
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

    async def _check_newest(self, presented: _Presented, *, csr_key_digest: str, tx: Transaction) -> None:
        """Only the newest certificate renews, unless the CSR asks again for the newest one's key (a renewal whose
        answer was lost: the CSR proves possession of that key)."""
        newest = await self._store.certificates.newest(presented.record.spiffe_id, tx=tx)
        if newest is not None and newest.serial != presented.record.serial and newest.key_sha256 != csr_key_digest:
            raise UnauthenticatedError(
                "a newer certificate of this node exists: renew that one", details={"reason": "superseded"}
            )

    # --- retirement -------------------------------------------------------------------------------------------

    async def retire(self, node_id: str, *, reason: str = "retired") -> NodeRecord:
        """Retire a node for good and revoke its certificates (publishing ``certificate.revoked``), in one
        transaction: it can no longer renew, fetch secrets or hold a session, and its hardware may join again as a
        new node.

        Raises:
            NotFoundError: there is no such node.
        """
        async with self._store.transaction() as tx:
            node = await retire_node(tx, self._store, self.ca, node_id, reason=reason)
        log.info("node %s retired", node_id)
        return node

    # --- presented certificates -------------------------------------------------------------------------------

    async def node_of(self, certificate_pem: str) -> NodeRecord:
        """The live node a presented certificate belongs to (checked as for renewal)."""
        return (await self._presented(certificate_pem)).node

    async def _presented(self, certificate_pem: str) -> _Presented:
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
        try:
            verifier = PolicyBuilder().store(TrustStore(bundle)).time(now).build_client_verifier()
            verifier.verify(certificate, [])
        except VerificationError:
            raise UnauthenticatedError(
                "the certificate does not chain to this control plane's CA", details={"reason": "untrusted"}
            ) from None
        serial = format(certificate.serial_number, "x")
        record = await self._store.certificates.get(serial)
        if record is None:
            raise UnauthenticatedError(
                "the certificate was not issued by this control plane's CA", details={"reason": "untrusted"}
            )
        if await self._store.certificates.is_revoked(serial):
            raise UnauthenticatedError("the certificate was revoked", details={"reason": "certificate_revoked"})
        if record.role != "node":
            raise FailedPreconditionError(
                f"{record.role} certificates are not renewed here", details={"reason": "role", "role": record.role}
            )
        node = await self._store.nodes.get(record.node_id)
        if node is None or node.state == "retired":
            raise AccessDeniedError(
                "the node is retired", details={"reason": "node_retired", "node_id": record.node_id}
            )
        return _Presented(record=record, certificate=certificate, node=node)


class GatewayServices:
    """What ``create_gateway`` relays to (``compute.gateway_services``): ``join``, ``renew_challenge``, ``renew``
    and ``secret``, plus ``trust_bundle_pem`` and ``is_revoked`` for the gateway's own handshake checks.

    The gateway is not trusted with any of it: every answer is decided here from what the node itself sealed or
    signed.
    """

    def __init__(
        self, joins: JoinService, broker: SecretBroker, *, store: Store, replay_guard: ReplayGuard, clock: Clock
    ) -> None:
        self.joins = joins
        # JoinService's own methods, as they are (their docstrings tell the refusals).
        self.join = joins.join
        self.renew_challenge = joins.renew_challenge
        self.renew = joins.renew
        self._store = store
        self._broker = broker
        self._guard = replay_guard
        self._clock = clock

    def __repr__(self) -> str:
        return f"GatewayServices(trust_domain={self.joins.ca.trust_domain!r})"

    async def secret(
        self,
        *,
        certificate_pem: str,
        name: str,
        ephemeral_public_jwk: Mapping[str, Any],
        signed_at_ms: int,
        nonce: bytes,
        signature: bytes,
    ) -> str:
        """The secret ``name`` as JWE to ``ephemeral_public_jwk``, for the node of ``certificate_pem``, which signed
        the request (``secret_message``) at ``signed_at_ms`` with a fresh 16-byte ``nonce``.

        Every refusal of a request made with a certificate this CA issued is audited (``compute:secrets:release``,
        outcome ``denied``, with the reason), as the broker audits its own answers.

        Raises:
            InvalidInputError: a malformed certificate, name, JWK, time, nonce or signature.
            UnauthenticatedError: the certificate is expired, untrusted or revoked; the request is older than two
                minutes, from the future, replayed, or not signed by the certificate's key.
            AccessDeniedError: the node is retired, or no secret of that name is granted to it (audited).
        """
        if not isinstance(nonce, bytes) or len(nonce) != 16:
            raise InvalidInputError("nonce: expected 16 bytes", details={"path": "nonce"})
        if isinstance(signed_at_ms, bool) or not isinstance(signed_at_ms, int) or abs(signed_at_ms) >= 2**62:
            raise InvalidInputError(
                "signed_at_ms: expected milliseconds since the epoch", details={"path": "signed_at_ms"}
            )
        if not isinstance(name, str) or not 1 <= len(name) <= 128:
            raise InvalidInputError("name: must be 1 to 128 characters", details={"path": "name"})
        if not isinstance(ephemeral_public_jwk, Mapping):
            raise InvalidInputError(
                "ephemeral_public_jwk: expected a JWK object", details={"path": "ephemeral_public_jwk"}
            )
        try:
            thumbprint = JWKRegistry.import_key(dict(ephemeral_public_jwk)).thumbprint()
        except (JoseError, ValueError, TypeError, KeyError):
            raise InvalidInputError(
                "ephemeral_public_jwk: not a valid public key", details={"path": "ephemeral_public_jwk"}
            ) from None
        try:
            node = await self._checked_request(
                certificate_pem, name, thumbprint, signed_at_ms=signed_at_ms, nonce=nonce, signature=signature
            )
        except (UnauthenticatedError, AccessDeniedError, FailedPreconditionError) as exc:
            await self._audit_refusal(certificate_pem, name, thumbprint, exc)
            raise
        identity = NodeIdentity(node_id=node.id, pool_id=node.pool_id, site_id=node.site_id, tenant=node.tenant)
        return await self._broker.secret(identity, name, ephemeral_public_jwk)

    async def _checked_request(
        self, certificate_pem: str, name: str, thumbprint: str, *, signed_at_ms: int, nonce: bytes, signature: bytes
    ) -> NodeRecord:
        presented = await self.joins._presented(certificate_pem)
        verify_signature(
            presented.certificate.public_key(), signature, secret_message(signed_at_ms, nonce, name, thumbprint)
        )
        now = self._clock.now()
        signed_at = dt.datetime.fromtimestamp(signed_at_ms / 1000, dt.UTC)
        if signed_at < now - SECRET_REQUEST_TTL:
            raise UnauthenticatedError("the request is too old; sign it again", details={"reason": "expired"})
        if signed_at > now + _SKEW:
            raise UnauthenticatedError(
                "the request is stamped in the future: check the node's clock", details={"reason": "from_the_future"}
            )
        remember_until = signed_at + SECRET_REQUEST_TTL + _SKEW
        if not await self._guard.first_use("secret/v1", nonce, expires_at=remember_until, now=now):
            raise UnauthenticatedError("this request was already used", details={"reason": "replayed"})
        return presented.node

    async def _audit_refusal(self, certificate_pem: str, name: str, thumbprint: str, error: ComputeError) -> None:
        """Audit a refused request whose certificate this CA issued (garbage from nowhere is only refused)."""
        try:
            serial = format(x509.load_pem_x509_certificate(certificate_pem.encode()).serial_number, "x")
        except ValueError:
            return
        record = await self._store.certificates.get(serial)
        if record is None:
            return
        node = await self._store.nodes.get(record.node_id)
        async with self._store.transaction() as tx:
            await tx.audit(
                AuditRecord(
                    action=RELEASE_ACTION,
                    actor=f"node:{record.node_id}",
                    tenant=node.tenant if node is not None else None,
                    resource_type="secret",
                    resource_id=None,
                    decision_id=None,
                    outcome="denied",
                    details={
                        "name": name,
                        "node_id": record.node_id,
                        "serial": serial,
                        "jwk_thumbprint": thumbprint,
                        "reason": error.details.get("reason", error.code),
                    },
                )
            )
        log.info("secret %r refused to node %s: %s", name, record.node_id, error.details.get("reason", error.code))

    async def trust_bundle_pem(self) -> str:
        """The CA certificates a gateway trusts for client certificates (PEM)."""
        return await self.joins.ca.trust_bundle_pem()

    async def is_revoked(self, serial: int | str) -> bool:
        """Whether a certificate is revoked (the gateway asks at each handshake)."""
        return await self.joins.ca.is_revoked(serial)


def _refuse_spent(revoked: bool, expired: bool, exhausted: bool) -> None:
    if revoked:
        raise UnauthenticatedError("the join token was revoked", details={"reason": "token_revoked"})
    if expired:
        raise UnauthenticatedError("the join token has expired", details={"reason": "token_expired"})
    if exhausted:
        raise UnauthenticatedError("the join token has no uses left", details={"reason": "token_exhausted"})


def _claims(claims: Mapping[str, Any]) -> HardwareClaims:
    if not isinstance(claims, Mapping):
        raise InvalidInputError("claims: expected an object", details={"path": "claims"})
    return decode(_ClaimsInput, {"claims": dict(claims)}).claims
