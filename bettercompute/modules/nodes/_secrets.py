"""What a node's secret request is handed to: ``SecretReleaser``, the protocol ``SecretBroker`` (the ``secrets``
module's) satisfies, and ``NodeIdentity``, who asks. ``better_compute()`` wires the broker in; the ``nodes`` module
never imports the ``secrets`` module."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs

__all__ = ["NodeIdentity", "SecretReleaser"]


@attrs.frozen(kw_only=True)
class NodeIdentity:
    """Who asks: a node (from its certificate), its pool and its site. ``tenant``, when known, narrows the search to
    that tenant's secrets."""

    node_id: str
    pool_id: str
    site_id: str | None = None
    tenant: str | None = None

    def scopes(self) -> tuple[str, ...]:
        """The scopes this node is entitled to."""
        found = [f"node:{self.node_id}", f"pool:{self.pool_id}"]
        if self.site_id is not None:
            found.append(f"site:{self.site_id}")
        return tuple(found)


class SecretReleaser(Protocol):
    """Releases a secret to one node (``SecretBroker``)."""

    release_action: str
    """The audit action of its answers, which the gateway services also write when they refuse a request."""

    async def secret(self, identity: NodeIdentity, name: str, ephemeral_public_jwk: Mapping[str, Any]) -> str:
        """The secret ``name`` as JWE to ``ephemeral_public_jwk`` if ``identity`` is entitled to it.

        Raises:
            AccessDeniedError: the node is not entitled to it, or it does not exist.
            InvalidInputError: a malformed name or key.
        """
        ...
