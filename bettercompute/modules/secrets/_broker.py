"""``SecretBroker``: a secret released to one node, as JWE encrypted to a key the node made for that one request.

Entitlement: a secret scoped ``node:<id>`` goes to that node, ``pool:<id>`` to the nodes of that pool, ``site:<id>``
to the nodes of that site; anything else is ``ACCESS_DENIED`` (a missing secret too, so a node cannot probe which
names exist). Every answer, release or refusal, writes an audit row (``compute:secrets:release``) naming the node,
the secret and the key's thumbprint, never the value; a release is audited before the JWE is returned.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from joserfc import jwe
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, JWKRegistry, OKPKey

from bettercompute.errors import AccessDeniedError, FailedPreconditionError, InvalidInputError
from bettercompute.modules.nodes import NodeIdentity
from bettercompute.modules.secrets._port import SECRETS
from bettercompute.modules.secrets._service import require_kms, value_context
from bettercompute.ports import AuditRecord, Kms, Store

__all__ = ["RELEASE_ACTION", "NodeIdentity", "SecretBroker"]

log = logging.getLogger("bettercompute.secrets")

RELEASE_ACTION = "compute:secrets:release"
"""The audit action of the broker's answers (not a method: nodes are not IAM principals)."""
JWE_HEADER = {"alg": "ECDH-ES+A256KW", "enc": "A256GCM"}
_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_CURVES = {"EC": {"P-256", "P-384", "P-521"}, "OKP": {"X25519", "X448"}}
_MAX_JWK_FIELDS = 16


def _id(value: str | None, path: str) -> None:
    if value is not None and not (isinstance(value, str) and _ID.fullmatch(value)):
        raise InvalidInputError(f"{path}: must be 1 to 128 of A-Z, a-z, 0-9, '.', '_' and '-'", details={"path": path})


def _public_key(jwk: Any) -> tuple[ECKey | OKPKey, str]:
    """The request's ephemeral public key and its RFC 7638 thumbprint; ``INVALID_INPUT`` for anything else."""
    path = "ephemeral_public_jwk"
    if not isinstance(jwk, Mapping) or len(jwk) > _MAX_JWK_FIELDS or not all(isinstance(k, str) for k in jwk):
        raise InvalidInputError(f"{path}: expected a JWK object", details={"path": path})
    if "d" in jwk:
        raise InvalidInputError(f"{path}: send the public key only (no 'd')", details={"path": path})
    kty, crv = jwk.get("kty"), jwk.get("crv")
    if kty not in _CURVES or crv not in _CURVES[kty]:
        raise InvalidInputError(
            f"{path}: expected an EC (P-256, P-384, P-521) or OKP (X25519, X448) key", details={"path": path}
        )
    try:
        key = JWKRegistry.import_key(dict(jwk))
    except (JoseError, ValueError, TypeError):
        raise InvalidInputError(f"{path}: not a valid public key", details={"path": path}) from None
    if not isinstance(key, ECKey | OKPKey):  # pragma: no cover - kty is checked above
        raise InvalidInputError(f"{path}: not an EC or OKP key", details={"path": path})
    return key, key.thumbprint()


class SecretBroker:
    """Releases secrets to entitled nodes (``gateway_services`` serves it as ``Secret``).

    Args:
        store: The store (its ``secrets`` and transactions for audit rows).
        kms: The KMS the ``secrets`` group sealed the values with (``Options.kms``).
    """

    release_action = RELEASE_ACTION

    def __init__(self, store: Store, kms: Kms | None) -> None:
        self._store = store
        self._kms = require_kms(kms)

    async def secret(self, identity: NodeIdentity, name: str, ephemeral_public_jwk: Mapping[str, Any]) -> str:
        """The value of secret ``name`` as JWE compact (``ECDH-ES+A256KW`` / ``A256GCM``) to ``ephemeral_public_jwk``.

        Raises:
            InvalidInputError: a malformed name or identity, or a JWK that is not an EC/OKP public key.
            AccessDeniedError: no secret of that name is scoped to this node, its pool or its site.
            FailedPreconditionError: secrets of that name in more than one tenant are scoped to this node (give
                ``identity.tenant``); nothing is released.
        """
        _id(name, "name")
        _id(identity.node_id, "identity.node_id")
        _id(identity.pool_id, "identity.pool_id")
        _id(identity.site_id, "identity.site_id")
        _id(identity.tenant, "identity.tenant")
        key, thumbprint = _public_key(ephemeral_public_jwk)
        found = await self._store.repository(SECRETS).named(name, scopes=identity.scopes(), tenant=identity.tenant)
        details: dict[str, Any] = {
            "name": name,
            "node_id": identity.node_id,
            "pool_id": identity.pool_id,
            "site_id": identity.site_id,
            "jwk_thumbprint": thumbprint,
        }
        if len({record.tenant for record in found}) != 1:
            outcome = "denied" if not found else "ambiguous"
            await self._audit(tenant=identity.tenant, resource_id=None, outcome=outcome, details=details)
            log.info("secret %r refused to node %s: %s", name, identity.node_id, outcome)
            if not found:
                raise AccessDeniedError(
                    "no secret of this name is granted to this node, its pool or its site",
                    details={"name": name, "node_id": identity.node_id},
                )
            raise FailedPreconditionError(
                "secrets of this name in several tenants are granted to this node; ask with the node's tenant",
                details={"name": name, "node_id": identity.node_id},
            )
        record = found[0]
        value = await self._kms.decrypt(record.sealed_value, context=value_context(record.tenant, record.name))
        token = jwe.encrypt_compact(dict(JWE_HEADER), value, key)
        await self._audit(
            tenant=record.tenant, resource_id=record.id, outcome="ok", details={**details, "scope": record.scope}
        )
        log.info("secret %r released to node %s (scope %s)", name, identity.node_id, record.scope)
        return token

    async def _audit(
        self, *, tenant: str | None, resource_id: str | None, outcome: str, details: dict[str, Any]
    ) -> None:
        async with self._store.transaction() as tx:
            await tx.audit(
                AuditRecord(
                    action=RELEASE_ACTION,
                    actor=f"node:{details['node_id']}",
                    tenant=tenant,
                    resource_type="secret",
                    resource_id=resource_id,
                    decision_id=None,
                    outcome=outcome,
                    details=details,
                )
            )
