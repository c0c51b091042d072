"""``GatewayServicesPort``: what a gateway asks the control plane for. The control plane's ``GatewayServices`` is one
(in process, ``serve --roles all``); ``RemoteGatewayServices`` is another, which asks the api process over the internal
mutual-TLS channel, so that the gateway process holds no CA, JoinService or KMS key."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from bettercompute.modules.nodes import JoinResult, RenewResult, ServerCertificate, TunnelGrant
from bettercompute.ports import Clock

__all__ = ["GatewayServicesPort"]


class GatewayServicesPort(Protocol):
    """Everything a gateway relays or asks; every answer is decided by the control plane, never by the gateway."""

    @property
    def clock(self) -> Clock:
        """The clock the gateway dates what it dispatches with."""
        ...

    async def join(
        self,
        *,
        sealed_token: bytes,
        csr_pem: str,
        claims: Mapping[str, Any],
        evidence: Mapping[str, Any] | None = None,
        pool_id: str | None = None,
    ) -> JoinResult: ...

    async def renew_challenge(self, *, certificate_pem: str) -> bytes: ...

    async def renew(self, *, certificate_pem: str, challenge: bytes, signature: bytes, csr_pem: str) -> RenewResult: ...

    async def secret(
        self,
        *,
        certificate_pem: str,
        name: str,
        ephemeral_public_jwk: Mapping[str, Any],
        signed_at_ms: int,
        nonce: bytes,
        signature: bytes,
    ) -> str: ...

    async def call(
        self, method: str, *, certificate_pem: str | None, input: Mapping[str, Any]
    ) -> Mapping[str, Any]: ...

    async def trust_bundle_pem(self) -> str: ...

    async def session_node(self, certificate_pem: str) -> str: ...

    async def issue_server_certificate(self, csr_pem: str, *, name: str, hosts: Sequence[str]) -> ServerCertificate: ...

    async def tunnel_accept(self, ticket: str) -> TunnelGrant: ...

    async def tunnel_node(self, tunnel_id: str, certificate_pem: str) -> TunnelGrant: ...

    async def tunnel_check(self, ids: Sequence[str]) -> dict[str, str]: ...

    async def tunnel_closed(self, tunnel_id: str, reason: str, bytes_up: int = 0, bytes_down: int = 0) -> bool: ...
