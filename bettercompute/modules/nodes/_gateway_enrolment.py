"""Gateway enrolment: how a gateway process that holds no key gets its first certificate.

An operator mints a one-time enrolment token where the KMS key is (``better-compute gateways token``); the gateway
presents it once, with a CSR, on the api process's internal listener and gets a certificate in role ``gateway``
(``spiffe://<trust-domain>/gateway/<name>``) for the hosts daemons dial. That certificate is both the gateway's
server certificate on the daemons' port and its client certificate on the internal channel; it is renewed over the
channel before it expires, from a new CSR, so no gateway key ever leaves the gateway.

The token is ``bcgw_<pin>.<sealed>``: ``pin`` is the CA pin (``bundle_pin`` without its ``sha256:``) that tells the
gateway which internal listener to trust before it has any certificate, and ``sealed`` is the KMS's sealing of the
gateway's name, the token's expiry and a nonce, bound to the context ``gateway-enrolment/v1``. Only the api process
can open it, a changed byte makes it fail to open, and the nonce is spent on first use (the replay guard), so a token
enrols one gateway once. Nothing is stored for an unspent token: it cannot be listed or revoked, which is why it
lives an hour by default and at most a day.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import logging
import re
import secrets
from collections.abc import Sequence

from bettercompute.errors import InternalError, InvalidInputError, UnauthenticatedError
from bettercompute.modules.nodes._ca import GATEWAY_ROLE, CertificateAuthority, IssuedBundle
from bettercompute.modules.nodes._install import bundle_pin
from bettercompute.modules.nodes._x509 import checked_segment
from bettercompute.ports import AuditRecord, Clock, Kms, ReplayGuard, Store

__all__ = ["ENROL_ACTION", "GATEWAY_TOKEN_PREFIX", "GatewayEnrolment", "parse_gateway_token"]

log = logging.getLogger("bettercompute.joins")

GATEWAY_TOKEN_PREFIX = "bcgw_"  # noqa: S105 - a prefix, not a secret
ENROL_ACTION = "compute:gateways:enrol"
MINT_ACTION = "compute:gateways:token"
DEFAULT_TTL = dt.timedelta(hours=1)
MAX_TTL = dt.timedelta(days=1)
_CONTEXT = "gateway-enrolment/v1"
_TOKEN = re.compile(r"bcgw_([0-9a-f]{64})\.([A-Za-z0-9_-]{16,2048})")


def parse_gateway_token(token: str) -> tuple[str, bytes]:
    """``(pin, sealed)`` of an enrolment token; ``pin`` in ``bundle_pin``'s form (``sha256:<hex>``).

    Raises:
        InvalidInputError: it is not one (the token itself is never repeated).
    """
    match = _TOKEN.fullmatch(token) if isinstance(token, str) else None
    if match is None:
        raise InvalidInputError(
            "token: expected a gateway enrolment token (bcgw_...)", details={"path": "token", "reason": "malformed"}
        )
    text = match.group(2)
    try:
        sealed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise InvalidInputError(
            "token: expected a gateway enrolment token (bcgw_...)", details={"path": "token", "reason": "malformed"}
        ) from None
    return "sha256:" + match.group(1), sealed


class GatewayEnrolment:
    """Mints gateway enrolment tokens and spends them (see the module docstring)."""

    def __init__(self, ca: CertificateAuthority, kms: Kms, *, store: Store, replay_guard: ReplayGuard, clock: Clock):
        self._ca = ca
        self._kms = kms
        self._store = store
        self._guard = replay_guard
        self._clock = clock

    def __repr__(self) -> str:
        return f"GatewayEnrolment(trust_domain={self._ca.trust_domain!r})"

    async def mint(self, name: str, *, ttl: dt.timedelta = DEFAULT_TTL, actor: str = "operator") -> str:
        """A one-time token that enrols the gateway ``name`` within ``ttl`` (audited, the token itself never).

        Raises:
            InvalidInputError: ``name`` is not a SPIFFE path segment (letters, digits, ``.``, ``_``, ``-``), or
                ``ttl`` is not positive or longer than a day.
        """
        checked_segment(name)
        if not dt.timedelta(0) < ttl <= MAX_TTL:
            raise InvalidInputError(
                "ttl: an enrolment token lives more than 0 seconds and at most a day",
                details={"field": "ttl", "max_seconds": int(MAX_TTL.total_seconds())},
            )
        expires = self._clock.now() + ttl
        payload = {"name": name, "expires_ms": int(expires.timestamp() * 1000), "nonce": secrets.token_hex(16)}
        sealed = await self._kms.encrypt(json.dumps(payload, separators=(",", ":")).encode(), context=_CONTEXT)
        pin = bundle_pin(await self._ca.trust_bundle_pem()).removeprefix("sha256:")
        async with self._store.transaction() as tx:
            await tx.audit(
                AuditRecord(
                    action=MINT_ACTION,
                    actor=actor,
                    tenant=None,
                    resource_type="gateway",
                    resource_id=name,
                    decision_id=None,
                    outcome="ok",
                    details={"name": name, "expires_at": expires.isoformat()},
                )
            )
        return GATEWAY_TOKEN_PREFIX + pin + "." + base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()

    async def enrol(self, token: str, *, csr_pem: str, hosts: Sequence[str]) -> IssuedBundle:
        """Spend ``token``: a certificate for the gateway it names, for the key of ``csr_pem``, valid for ``hosts``
        (audited as ``compute:gateways:enrol``).

        Raises:
            InvalidInputError: a malformed token, CSR or host.
            UnauthenticatedError: the token does not open here (another deployment's, or altered), has expired
                (``expired``) or was already used (``replayed``).
        """
        _, sealed = parse_gateway_token(token)
        try:
            opened = json.loads(await self._kms.decrypt(sealed, context=_CONTEXT))
            name, expires_ms, nonce = str(opened["name"]), int(opened["expires_ms"]), bytes.fromhex(opened["nonce"])
        except (InternalError, ValueError, KeyError, TypeError):
            raise UnauthenticatedError(
                "the enrolment token is not one this control plane made", details={"reason": "token"}
            ) from None
        now = self._clock.now()
        expires = dt.datetime.fromtimestamp(expires_ms / 1000, dt.UTC)
        if expires <= now:
            raise UnauthenticatedError("the enrolment token has expired; mint a new one", details={"reason": "expired"})
        if not await self._guard.first_use("gateway-enrol/v1", nonce, expires_at=expires, now=now):
            raise UnauthenticatedError("the enrolment token was already used", details={"reason": "replayed"})
        issued = await self._ca.issue_server(csr_pem, name=name, hosts=hosts)
        async with self._store.transaction() as tx:
            await tx.audit(
                AuditRecord(
                    action=ENROL_ACTION,
                    actor=f"{GATEWAY_ROLE}:{name}",
                    tenant=None,
                    resource_type="gateway",
                    resource_id=name,
                    decision_id=None,
                    outcome="ok",
                    details={"name": name, "serial": issued.serial, "hosts": list(hosts)},
                )
            )
        log.info("gateway %s enrolled (certificate %s)", name, issued.serial)
        return issued
