"""``GatewayServices``: what a gateway relays ``Join``, ``Renew`` and ``Secret`` to, decided here from what the node
sealed or signed."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from cryptography import x509
from joserfc.errors import JoseError
from joserfc.jwk import JWKRegistry

from bettercompute._runtime.gateway_methods import GatewayCall, GatewayCaller, GatewayMethod
from bettercompute.errors import (
    AccessDeniedError,
    ComputeError,
    FailedPreconditionError,
    InvalidInputError,
    NotFoundError,
    UnauthenticatedError,
)
from bettercompute.modules.nodes._ca import GATEWAY_ROLE, IssuedBundle
from bettercompute.modules.nodes._gateway_enrolment import GatewayEnrolment
from bettercompute.modules.nodes._join import JoinService
from bettercompute.modules.nodes._port import CERTIFICATES, NODES, NodeRecord
from bettercompute.modules.nodes._proofs import (
    secret_message,
    verify_signature,
)
from bettercompute.modules.nodes._renew import CLOCK_SKEW
from bettercompute.modules.nodes._secrets import NodeIdentity, SecretReleaser
from bettercompute.modules.nodes._tokens import hash_secret
from bettercompute.modules.nodes._tunnels import (
    TUNNELS,
    TunnelCheck,
    TunnelGrant,
    TunnelRecord,
    closed_record,
    parse_ticket,
)
from bettercompute.ports import AuditRecord, Clock, FreshIam, ReplayGuard, Store

if TYPE_CHECKING:
    from bettercompute._runtime.context import ModuleContext

__all__ = ["GatewayServices", "ServerCertificate"]

log = logging.getLogger("bettercompute.joins")

SECRET_REQUEST_TTL = dt.timedelta(minutes=2)


@attrs.frozen(kw_only=True)
class ServerCertificate:
    """A gateway's certificate as the control plane issued it: the leaf, the issuing CA certificate to send with it,
    the trust bundle client certificates must chain to, and its validity."""

    certificate_pem: str
    chain_pem: str
    trust_bundle_pem: str
    not_before: dt.datetime
    not_after: dt.datetime


def _server_certificate(issued: IssuedBundle, bundle_pem: str) -> ServerCertificate:
    return ServerCertificate(
        certificate_pem=issued.certificate_pem,
        chain_pem=issued.chain_pem,
        trust_bundle_pem=bundle_pem,
        not_before=issued.not_before,
        not_after=issued.not_after,
    )


class GatewayServices:
    """What ``create_gateway`` relays to (``compute.gateway_services``): ``join``, ``renew_challenge``, ``renew``
    and ``secret``, plus ``trust_bundle_pem`` and ``is_revoked`` for the gateway's own handshake checks.

    The gateway is not trusted with any of it: every answer is decided here from what the node itself sealed or
    signed.
    """

    def __init__(
        self,
        joins: JoinService,
        broker: SecretReleaser,
        *,
        store: Store,
        replay_guard: ReplayGuard,
        clock: Clock,
        context: ModuleContext | None = None,
        methods: Sequence[GatewayMethod] = (),
        tunnel_checks: Mapping[str, TunnelCheck] | None = None,
        enrolment: GatewayEnrolment | None = None,
    ) -> None:
        self.joins = joins
        self.enrolment = enrolment
        """Mints and spends gateway enrolment tokens (``None``: gateways are only hosted in process)."""
        self._tunnel_checks = dict(tunnel_checks or {})
        self._context = context
        self._methods = {m.name: m for m in methods}
        # JoinService's own methods, as they are (their docstrings tell the refusals).
        self.join = joins.join
        self.renew_challenge = joins.renew_challenge
        self.renew = joins.renew
        self._store = store
        self._broker = broker
        self._guard = replay_guard
        self._clock = clock
        self.clock = clock
        """The control plane's clock (a gateway dates what it dispatches with it)."""

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
        presented = await self.joins.renewals.presented(certificate_pem)
        verify_signature(
            presented.certificate.public_key(), signature, secret_message(signed_at_ms, nonce, name, thumbprint)
        )
        now = self._clock.now()
        signed_at = dt.datetime.fromtimestamp(signed_at_ms / 1000, dt.UTC)
        if signed_at < now - SECRET_REQUEST_TTL:
            raise UnauthenticatedError("the request is too old; sign it again", details={"reason": "expired"})
        if signed_at > now + CLOCK_SKEW:
            raise UnauthenticatedError(
                "the request is stamped in the future: check the node's clock", details={"reason": "from_the_future"}
            )
        remember_until = signed_at + SECRET_REQUEST_TTL + CLOCK_SKEW
        if not await self._guard.first_use("secret/v1", nonce, expires_at=remember_until, now=now):
            raise UnauthenticatedError("this request was already used", details={"reason": "replayed"})
        return presented.node

    async def _audit_refusal(self, certificate_pem: str, name: str, thumbprint: str, error: ComputeError) -> None:
        """Audit a refused request whose certificate this CA issued (garbage from nowhere is only refused)."""
        try:
            serial = format(x509.load_pem_x509_certificate(certificate_pem.encode()).serial_number, "x")
        except ValueError:
            return
        record = await self._store.repository(CERTIFICATES).get(serial)
        if record is None:
            return
        node = await self._store.repository(NODES).get(record.node_id)
        async with self._store.transaction() as tx:
            await tx.audit(
                AuditRecord(
                    action=self._broker.release_action,
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

    async def call(self, method: str, *, certificate_pem: str | None, input: Mapping[str, Any]) -> Mapping[str, Any]:
        """Run a module's gateway method (the ``Call`` RPC) for the holder of ``certificate_pem``.

        Raises:
            NotFoundError: no module declares ``method``.
            UnauthenticatedError: no certificate on a method that is not open, or one that is not valid here.
            AccessDeniedError: the certificate's role may not call ``method`` (``role``).
            ComputeError: whatever the method refuses with.
        """
        declared = self._methods.get(method) if isinstance(method, str) else None
        if declared is None or self._context is None:
            raise NotFoundError("no such gateway method", details={"method": str(method)[:64]})
        caller: GatewayCaller | None = None
        if certificate_pem is not None:
            record, certificate = await self.joins.renewals.verified(certificate_pem)
            if record.role not in declared.roles:
                raise AccessDeniedError(
                    f"a {record.role} certificate may not call {method}",
                    details={"reason": "role", "role": record.role},
                )
            caller = GatewayCaller(
                role=record.role,
                id=record.node_id,
                spiffe_id=record.spiffe_id,
                serial=record.serial,
                not_after=certificate.not_valid_after_utc,
                certificate=certificate,
            )
        elif not declared.open:
            raise UnauthenticatedError(f"{method} needs a client certificate", details={"reason": "no_certificate"})
        call = GatewayCall(method=method, caller=caller, input=input, context=self._context, issuer=self.joins.ca)
        return await declared.handler(call)

    async def session_node(self, certificate_pem: str) -> str:
        """The id of the live node whose certificate opens a ``Session`` (checked as for renewal).

        Raises:
            InvalidInputError: not a PEM certificate.
            UnauthenticatedError: it is expired, untrusted, revoked, or not a node's.
            AccessDeniedError: its node is retired.
        """
        return (await self.joins.node_of(certificate_pem)).id

    async def issue_server_certificate(self, csr_pem: str, *, name: str, hosts: Sequence[str]) -> ServerCertificate:
        """A certificate in role ``gateway`` for the gateway ``name`` hosted in this process (``serve --roles all``),
        for the key of ``csr_pem`` (which stays with the caller), valid for ``hosts``.

        Raises:
            InvalidInputError: a bad CSR, name or host.
        """
        issued = await self.joins.ca.issue_server(csr_pem, name=name, hosts=hosts)
        return _server_certificate(issued, await self.trust_bundle_pem())

    async def gateway_of(self, certificate_pem: str) -> str:
        """The name of the gateway whose certificate this is (the internal channel's check of its caller).

        Raises:
            InvalidInputError: not a PEM certificate.
            UnauthenticatedError: it is expired, untrusted or revoked.
            AccessDeniedError: it is not a gateway's certificate (``role``).
        """
        record, _ = await self.joins.renewals.verified(certificate_pem)
        if record.role != GATEWAY_ROLE:
            raise AccessDeniedError(
                "only a gateway's certificate may use this channel", details={"reason": "role", "role": record.role}
            )
        return record.node_id

    async def renew_gateway(self, certificate_pem: str, *, csr_pem: str, hosts: Sequence[str]) -> ServerCertificate:
        """A new certificate for the gateway of ``certificate_pem`` (which the caller proved it holds, in the
        internal channel's handshake), for the key of ``csr_pem``, valid for ``hosts``.

        Raises:
            InvalidInputError: a bad certificate, CSR or host.
            UnauthenticatedError: the certificate is expired, untrusted or revoked.
            AccessDeniedError: it is not a gateway's certificate.
        """
        name = await self.gateway_of(certificate_pem)
        issued = await self.joins.ca.issue_server(csr_pem, name=name, hosts=hosts)
        log.info("gateway %s renewed its certificate (%s)", name, issued.serial)
        return _server_certificate(issued, await self.trust_bundle_pem())

    async def enrol_gateway(self, token: str, *, csr_pem: str, hosts: Sequence[str]) -> ServerCertificate:
        """A gateway's first certificate, for a one-time enrolment token (``GatewayEnrolment.enrol``).

        Raises:
            InvalidInputError: a malformed token, CSR or host.
            UnauthenticatedError: the token does not open here, has expired or was used.
            FailedPreconditionError: this control plane has no enrolment (no KMS).
        """
        if self.enrolment is None:
            raise FailedPreconditionError("gateway enrolment needs the KMS", details={"reason": "no_enrolment"})
        issued = await self.enrolment.enrol(token, csr_pem=csr_pem, hosts=hosts)
        return _server_certificate(issued, await self.trust_bundle_pem())

    async def trust_bundle_pem(self) -> str:
        """The CA certificates a gateway trusts for client certificates (PEM)."""
        return await self.joins.ca.trust_bundle_pem()

    async def is_revoked(self, serial: int | str) -> bool:
        """Whether a certificate is revoked (the gateway asks at each handshake)."""
        return await self.joins.ca.is_revoked(serial)

    # --- tunnels (docs/tunnels.md) -------------------------------------------------------------------------------

    async def tunnel_accept(self, ticket: str) -> TunnelGrant:
        """Spend a tunnel's one-time ticket (a client's first frame) and say where the tunnel goes. The tunnel is
        checked as ``tunnel_check`` does before it is granted; a refused one is closed (and audited).

        Raises:
            UnauthenticatedError: not a ticket, or one that is unknown, spent, closed or expired (reason
                ``ticket``).
            AccessDeniedError: the caller may no longer open it (reason as ``tunnel_check`` says).
        """
        parsed = parse_ticket(ticket)
        refused = UnauthenticatedError(
            "the tunnel ticket is unknown, used or expired; ask for a new one", details={"reason": "ticket"}
        )
        if parsed is None:
            raise refused
        tunnel_id, secret = parsed
        record = await self._store.repository(TUNNELS).spend(
            tunnel_id, secret_hash=hash_secret(secret), now=self._clock.now()
        )
        if record is None:
            raise refused
        reason = (await self._reasons([record])).get(record.id)
        if reason is not None:
            await self.tunnel_closed(record.id, reason)
            raise AccessDeniedError("the tunnel may not be opened", details={"reason": reason})
        return _grant(record)

    async def tunnel_node(self, tunnel_id: str, certificate_pem: str) -> TunnelGrant:
        """The tunnel a node's ``Tunnel`` stream answers: the certificate must be current for a live node, the
        node the tunnel goes through, and the tunnel accepted and open.

        Raises:
            UnauthenticatedError: the certificate is not current for a live node.
            AccessDeniedError: the tunnel is unknown, not accepted, closed, or another node's (reason
                ``wrong_tunnel``).
        """
        node = await self.joins.node_of(certificate_pem)
        record = await self._store.repository(TUNNELS).get(tunnel_id) if isinstance(tunnel_id, str) else None
        if record is None or record.node_id != node.id or record.used_at is None or record.closed_at is not None:
            raise AccessDeniedError("no such open tunnel for this node", details={"reason": "wrong_tunnel"})
        return _grant(record)

    async def tunnel_check(self, ids: Sequence[str]) -> dict[str, str]:
        """Which of these open tunnels must close now, and why: ``closed`` (or the reason it was closed with),
        ``unknown``, ``credential_revoked`` (the caller's credential is revoked, expired or gone), ``access_revoked``
        (IAM no longer allows the tunnel's action on its resource), or what the owning module's check says. One
        statement reads them all; IAM is asked once per caller, action and resource, from the database (never a
        cache) when the IAM can (``FreshIam``)."""
        records = await self._store.repository(TUNNELS).checked(list(dict.fromkeys(ids)), now=self._clock.now())
        found = {r.id: r for r in records}
        reasons = {i: "unknown" for i in ids if i not in found}
        reasons.update(await self._reasons(records))
        return reasons

    async def _reasons(self, records: Sequence[TunnelRecord]) -> dict[str, str]:
        reasons: dict[str, str] = {}
        decided: dict[tuple[str, str, str, str, str], str | None] = {}
        now = self._clock.now()
        for record in records:
            if record.closed_at is not None:
                reasons[record.id] = record.close_reason or "closed"
                continue
            key = (record.credential_id, record.principal_id, record.action, record.resource_type, record.resource_id)
            if key not in decided:
                decided[key] = await self._allowed(record)
            reason = decided[key]
            if reason is None:
                check = self._tunnel_checks.get(record.resource_type)
                reason = await check(self._store, record, now) if check is not None else None
            if reason is not None:
                reasons[record.id] = reason
        return reasons

    async def _allowed(self, record: TunnelRecord) -> str | None:
        """Why IAM no longer allows the tunnel (``None``: it does)."""
        if self._context is None:
            return None
        iam = self._context.iam
        try:
            if isinstance(iam, FreshIam):
                await iam.require_fresh(record.caller(), record.action, record.resource())
            else:  # an IAM that cannot bypass its cache: revocation takes as long as its cache keeps an answer
                await iam.require(record.caller(), record.action, record.resource())
        except UnauthenticatedError:
            return "credential_revoked"
        except (AccessDeniedError, NotFoundError):
            return "access_revoked"
        return None

    async def tunnel_closed(self, tunnel_id: str, reason: str, bytes_up: int = 0, bytes_down: int = 0) -> bool:
        """Record that a tunnel ended, with why and how many bytes went each way (``up``: client to node), and
        audit it; ``False`` when it was closed already (nothing is written twice)."""
        async with self._store.transaction() as tx:
            record = await tx.repository(TUNNELS).close(
                tunnel_id, reason=reason[:128], bytes_up=bytes_up, bytes_down=bytes_down, now=self._clock.now()
            )
            if record is None:
                return False
            await tx.audit(closed_record(record))
        log.info("tunnel %s closed: %s", tunnel_id, reason)
        return True


def _grant(record: TunnelRecord) -> TunnelGrant:
    return TunnelGrant(
        id=record.id,
        tenant=record.tenant,
        node_id=record.node_id,
        host=record.host,
        port=record.port,
        resource_type=record.resource_type,
        resource_id=record.resource_id,
    )
