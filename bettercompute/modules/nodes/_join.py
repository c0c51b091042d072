"""JoinService: join, renewal (``Renewals``, in ``_renew``) and retirement.

No step calls IAM: a join is authorized by its token, a renewal and a secret request by the node's certificate and
a signature by its key. The gateway relaying them is not trusted: the sealed token is bound to the CSR, claims,
evidence and pool it was sealed with; renewals and secret requests are signed by the node over everything the
answer depends on.

Join, in order (nothing is written until every check passed; the node, its certificate record and the token's use
commit in one transaction, and nothing in it calls out):

1. Check the CSR (parses, its signature matches its key, asks for no name of its own).
2. Unseal the token (HPKE to JoinService's key, fresh, never seen before), check its binding, parse it.
3. Find the token and its pool (one statement) by id and secret hash; refuse it revoked, expired, exhausted or for
   another pool; decode the claims.
4. Run the attestor chain (the built-in ``claims`` attestor enforcing the token's ``expect`` first, then
   ``Options.attestors``), outside any transaction: an attestor may call out. Load the CA key.
5. In one transaction: enroll the node as ``adopting`` by its hardware key (a new node, or with ``reclaim:
   same-hardware`` the pool's live node with the same key, whose certificates are then revoked; while that node
   still holds a valid certificate only a token naming the serial, or an attestor's facts, may take it); sign and
   record its certificate (24 hours, or ``JoinSettings.certificate_ttl``); project it; spend a use of the token
   last (atomic: of two joins racing for the last use, one wins); audit it and publish ``node.joined``.

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
from bettercompute.modules.nodes._ca import CertificateAuthority
from bettercompute.modules.nodes._claims import (
    AttestationRequest,
    Attestor,
    HardwareClaims,
    chain,
    checked_evidence,
    hardware_key,
)
from bettercompute.modules.nodes._port import CERTIFICATES, JOIN_TOKENS, NODES, JoinTokenRecord, NodeRecord
from bettercompute.modules.nodes._proofs import (
    BINDING_BYTES,
    ChallengeIssuer,
    join_binding,
)
from bettercompute.modules.nodes._renew import NODE, Renewals, RenewResult
from bettercompute.modules.nodes._sealing import Unsealer
from bettercompute.modules.nodes._service import retire_node
from bettercompute.modules.nodes._tokens import hash_secret, parse_token
from bettercompute.modules.nodes._x509 import checked_csr_key, key_sha256
from bettercompute.modules.pools import PoolRecord
from bettercompute.ports import AuditRecord, Clock, OutboxEvent, ReplayGuard, ResourceRef, Store, Transaction

__all__ = ["JOIN_ACTION", "JoinResult", "JoinService", "RenewResult"]

log = logging.getLogger("bettercompute.joins")

JOIN_ACTION = "compute:nodes:join"
JOINED_EVENT = "node.joined"
_POOL_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


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
class _Opened:
    """A join's sealed payload, opened: the CSR's key, and the token's id and secret hash."""

    csr_key: Any
    token_id: str
    secret_hash: bytes


@attrs.frozen(kw_only=True)
class _Admitted:
    """What a join was admitted with, before its transaction: the token and its pool, the claims, what the attestors
    recorded, the hardware key, the node id the token binds (if any), and whether anything but the claims vouches
    for the machine (a serial in the token, a bound hardware key, an attestor's facts)."""

    token: JoinTokenRecord
    pool: PoolRecord
    hardware: HardwareClaims
    attestation: dict[str, str]
    hw_key: str
    bound_id: str | None
    vouched: bool


async def _record_in(
    tx: Transaction,
    token_id: str,
    node: NodeRecord,
    reclaimed: bool,
    serial: str,
    hw_key: str,
    uses_left: int | None,
) -> None:
    """A join's audit row and ``node.joined`` event, in its transaction."""
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
                "serial": serial,
                "hardware_key": hw_key,
                "uses_left": uses_left,
            },
        )
    )
    payload = {
        "node_id": node.id,
        "tenant": node.tenant,
        "pool_id": node.pool_id,
        "reclaimed": reclaimed,
        "enrollments": node.enrollments,
    }
    await tx.publish([OutboxEvent(type=JOINED_EVENT, key=node.id, payload=payload)])


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
        certificate_ttl: The lifetime of the certificates it issues (joins and renewals); the CA's default when
            ``None``.
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
        certificate_ttl: dt.timedelta | None = None,
    ) -> None:
        self._store = store
        self.ca = ca
        self._unsealer = unsealer
        self._challenges = challenges
        self._guard = replay_guard
        self._clock = clock
        self._attestors = chain(attestors)
        self._max_age = sealed_token_max_age
        self._ttl = certificate_ttl
        self.renewals = Renewals(
            store=store,
            ca=ca,
            challenges=challenges,
            replay_guard=replay_guard,
            clock=clock,
            certificate_ttl=certificate_ttl,
        )
        """Renewals of this service's certificates."""

    def __repr__(self) -> str:
        return f"JoinService(trust_domain={self.ca.trust_domain!r})"

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
        now = self._clock.now()
        opened = await self._open(sealed_token, csr_pem, claims, evidence, pool_id, now=now)
        admitted = await self._admit(opened, claims, evidence, pool_id, now=now)
        # Everything that may call out happens before the transaction: the CA key is loaded from the KMS, the
        # trust bundle read. The transaction itself only reads and writes the database.
        await self.ca.prepare()
        bundle_pem = await self.ca.trust_bundle_pem()
        async with self._store.transaction() as tx:
            node, reclaimed = await self._enroll_in(tx, opened, admitted, now=now)
            issued = await self.ca.issue_in(
                tx, csr_pem, node_id=node.id, role="node", ttl=self._ttl, checked_key=opened.csr_key
            )
            await tx.project(ResourceRef(type=NODE, id=node.id, tenant=node.tenant, pool=node.pool_id))
            # The token's row stays locked from here to the commit: spend the use last, so joins sharing a token
            # wait for each other as briefly as possible.
            spent = await tx.repository(JOIN_TOKENS).consume(
                id=opened.token_id, secret_hash=opened.secret_hash, now=now
            )
            if spent.outcome != "consumed":
                _refuse_spent(spent.outcome == "revoked", spent.outcome == "expired", spent.outcome == "exhausted")
                raise UnauthenticatedError("the join token is not valid", details={"reason": "unknown_token"})
            uses_left = spent.token.uses_left if spent.token else None
            await _record_in(tx, opened.token_id, node, reclaimed, issued.serial, admitted.hw_key, uses_left)
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

    async def _open(
        self,
        sealed_token: bytes,
        csr_pem: str,
        claims: Mapping[str, Any],
        evidence: Mapping[str, Any] | None,
        pool_id: str | None,
        *,
        now: dt.datetime,
    ) -> _Opened:
        """Step 1: the request's shape, then the sealed payload opened and checked against what it was sealed for."""
        if not isinstance(sealed_token, bytes):
            raise InvalidInputError("sealed_token: expected bytes", details={"path": "sealed_token"})
        if pool_id is not None and not (isinstance(pool_id, str) and _POOL_ID.fullmatch(pool_id)):
            raise InvalidInputError("pool_id: not a pool id", details={"path": "pool_id"})
        csr_key = checked_csr_key(csr_pem)
        csr_der = x509.load_pem_x509_csr(csr_pem.encode()).public_bytes(serialization.Encoding.DER)
        binding = join_binding(csr_der, claims, evidence, pool_id)
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
        return _Opened(csr_key=csr_key, token_id=token_id, secret_hash=hash_secret(secret))

    async def _admit(
        self,
        opened: _Opened,
        claims: Mapping[str, Any],
        evidence: Mapping[str, Any] | None,
        pool_id: str | None,
        *,
        now: dt.datetime,
    ) -> _Admitted:
        """Step 2: the token and its pool, the claims and evidence, the attestor chain and the token's bindings."""
        match = await self._store.repository(JOIN_TOKENS).matching(opened.token_id, secret_hash=opened.secret_hash)
        if match is None:
            raise UnauthenticatedError("the join token is not valid", details={"reason": "unknown_token"})
        token, pool = match.token, match.pool
        _refuse_spent(token.revoked_at is not None, token.expires_at <= now, token.uses_left <= 0)
        if pool_id is not None and pool_id != token.pool_id:
            raise AccessDeniedError(
                "the join token is for another pool than the one this machine is pinned to",
                details={"reason": "wrong_pool", "pool_id": pool_id},
            )
        hardware = _claims(claims)
        facts = checked_evidence(evidence)
        if pool.pool_class == "provider":
            raise FailedPreconditionError(
                "a provider pool takes no daemons: its machines are run through the provider's API",
                details={"reason": "pool_class", "pool_class": pool.pool_class},
            )
        request = AttestationRequest(
            claims=hardware, evidence=facts, token=token, pool=pool, csr_key_sha256=key_sha256(opened.csr_key)
        )
        attestation = await self._attest(request)
        hw_key = hardware_key(hardware)
        # A token minted for one machine (a bare-metal deploy) names its hardware key and the node id it joins as.
        bound_key = token.expect.get("hardware_key")
        if bound_key is not None and bound_key != hw_key:
            raise AccessDeniedError(
                "the machine's claims do not match what the join token expects: hardware_key",
                details={"reason": "expect_mismatch", "fields": ["hardware_key"]},
            )
        bound_id = token.expect.get("node_id")
        return _Admitted(
            token=token,
            pool=pool,
            hardware=hardware,
            attestation=attestation,
            hw_key=hw_key,
            bound_id=bound_id if isinstance(bound_id, str) else None,
            vouched="serial" in token.expect or bound_key is not None or bool(attestation),
        )

    async def _enroll_in(
        self, tx: Transaction, opened: _Opened, admitted: _Admitted, *, now: dt.datetime
    ) -> tuple[NodeRecord, bool]:
        """Step 3, in ``tx``: the node made or taken back (the reclaimed node's certificates revoked); ``(node,
        reclaimed)``."""
        enrollment = await tx.repository(NODES).enroll(
            new_id=admitted.bound_id or f"node_{secrets.token_hex(8)}",
            pool_id=admitted.pool.id,
            tenant=admitted.pool.tenant,
            hardware_key=admitted.hw_key,
            claims=attrs.asdict(admitted.hardware, recurse=True),
            attestation=admitted.attestation,
            join_token_id=opened.token_id,
            reclaim=admitted.token.reclaim == "same-hardware",
        )
        node = enrollment.node
        if admitted.bound_id is not None and node.id != admitted.bound_id:
            # The pool holds this hardware under another node id: the machine's own id cannot be taken.
            raise ConflictError(
                "this pool has the hardware as another node; retire that node (nodes.retire) first",
                details={"reason": "bound_node_mismatch"},
            )
        if enrollment.outcome == "conflict":
            raise ConflictError(
                "this pool has a node with the same hardware; retire it (nodes.retire), or join with a token whose"
                " reclaim is same-hardware",
                details={"reason": "hardware_taken"},
            )
        reclaimed = enrollment.outcome == "reclaimed"
        if reclaimed:
            spiffe_id = self.ca.spiffe_id(node.id)
            # Claims alone do not prove it is the same machine: while the node still holds a valid certificate (it
            # may be up and running), only a token that names the serial or an attestor may take it back.
            live = await tx.repository(CERTIFICATES).live_count_for(spiffe_id, now=now)
            if live and not admitted.vouched:
                raise ConflictError(
                    "the node with this hardware still holds a valid certificate: revoke it (nodes.revoke) or"
                    " retire it (nodes.retire) first, or join with a token whose expect names the serial",
                    details={"reason": "node_live"},
                )
            await self.ca.revoke_spiffe_id_in(tx, spiffe_id, reason="reclaimed by a new join of the same hardware")
        return node, reclaimed

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

    # --- renewal (``Renewals``) ------------------------------------------------------------------------------

    async def renew_challenge(self, *, certificate_pem: str) -> bytes:
        """A fresh challenge for renewing ``certificate_pem`` (see ``Renewals.renew_challenge``)."""
        return await self.renewals.renew_challenge(certificate_pem=certificate_pem)

    async def renew(self, *, certificate_pem: str, challenge: bytes, signature: bytes, csr_pem: str) -> RenewResult:
        """A new certificate for the node of ``certificate_pem`` (see ``Renewals.renew``)."""
        return await self.renewals.renew(
            certificate_pem=certificate_pem, challenge=challenge, signature=signature, csr_pem=csr_pem
        )

    async def node_of(self, certificate_pem: str) -> NodeRecord:
        """The live node a presented certificate belongs to (checked as for renewal)."""
        return await self.renewals.node_of(certificate_pem)

    async def retire(self, node_id: str, *, reason: str = "retired") -> NodeRecord:
        """Retire a node for good and revoke its certificates (publishing ``certificate.revoked``), in one
        transaction: it can no longer renew, fetch secrets or hold a session, and its hardware may join again as a
        new node.

        Raises:
            NotFoundError: there is no such node.
        """
        async with self._store.transaction() as tx:
            node = await retire_node(tx, self.ca, node_id, reason=reason)
        log.info("node %s retired", node_id)
        return node


def _refuse_spent(revoked: bool, expired: bool, exhausted: bool) -> None:
    if revoked:
        raise UnauthenticatedError("the join token was revoked", details={"reason": "token_revoked"})
    if expired:
        raise UnauthenticatedError("the join token has expired", details={"reason": "token_expired"})
    if exhausted:
        raise UnauthenticatedError("the join token has no uses left", details={"reason": "token_exhausted"})


def hardware_key_of(claims: Mapping[str, Any]) -> str:
    """The hardware key JoinService computes for these claims (as ``bcd`` sends them).

    Raises:
        InvalidInputError: the claims are malformed.
    """
    return hardware_key(_claims(claims))


def _claims(claims: Mapping[str, Any]) -> HardwareClaims:
    if not isinstance(claims, Mapping):
        raise InvalidInputError("claims: expected an object", details={"path": "claims"})
    return decode(_ClaimsInput, {"claims": dict(claims)}).claims
