"""The calls relayed to the control plane's gateway services: ``Join``, ``TrustBundle``, ``RenewChallenge``,
``Renew``, ``Secret`` and a module's ``Call``. The gateway decides none of them: it reads the request and the
connection's client certificate, and hands both on."""

from __future__ import annotations

import json
from typing import Any

from grpclib.server import Stream

import bettercompute_proto as wire
from bettercompute.modules.nodes import JoinResult, RenewResult

from ._port import GatewayServicesPort
from ._wire import client_certificate, json_object, ms, unary

__all__ = ["ServiceRelay"]


class ServiceRelay:
    """One grpclib handler per relayed call."""

    def __init__(self, services: GatewayServicesPort, *, most: int) -> None:
        self._services = services
        self._most = most

    async def join(self, stream: Stream[Any, Any]) -> None:
        async def answer(request: wire.JoinRequest) -> wire.JoinResponse:
            result = await self._services.join(
                sealed_token=request.sealed_token,
                csr_pem=request.csr_pem,
                claims=json_object(request.claims_json, "claims_json"),
                evidence=json_object(request.evidence_json, "evidence_json") if request.evidence_json else None,
                pool_id=request.pool_id or None,
            )
            return wire.JoinResponse(
                certificate=_certificate(result),
                tenant=result.tenant,
                pool_id=result.pool_id,
                reclaimed=result.reclaimed,
            )

        await unary(stream, wire.JoinRequest, answer, most=self._most)

    async def trust_bundle(self, stream: Stream[Any, Any]) -> None:
        # No client certificate needed: a daemon pinned with ``--ca-pin`` asks before it trusts anything, and checks
        # the answer against its pin (the bundle is public; the pin is what makes it trusted).
        async def answer(request: wire.TrustBundleRequest) -> wire.TrustBundleResponse:
            return wire.TrustBundleResponse(trust_bundle_pem=await self._services.trust_bundle_pem())

        await unary(stream, wire.TrustBundleRequest, answer, most=self._most)

    async def renew_challenge(self, stream: Stream[Any, Any]) -> None:
        async def answer(request: wire.RenewChallengeRequest) -> wire.RenewChallengeResponse:
            challenge = await self._services.renew_challenge(certificate_pem=client_certificate(stream))
            return wire.RenewChallengeResponse(challenge=challenge)

        await unary(stream, wire.RenewChallengeRequest, answer, most=self._most)

    async def renew(self, stream: Stream[Any, Any]) -> None:
        async def answer(request: wire.RenewRequest) -> wire.RenewResponse:
            result = await self._services.renew(
                certificate_pem=client_certificate(stream),
                challenge=request.challenge,
                signature=request.signature,
                csr_pem=request.csr_pem,
            )
            return wire.RenewResponse(certificate=_certificate(result))

        await unary(stream, wire.RenewRequest, answer, most=self._most)

    async def secret(self, stream: Stream[Any, Any]) -> None:
        async def answer(request: wire.SecretRequest) -> wire.SecretResponse:
            jwe = await self._services.secret(
                certificate_pem=client_certificate(stream),
                name=request.name,
                ephemeral_public_jwk=json_object(request.ephemeral_public_jwk_json, "ephemeral_public_jwk_json"),
                signed_at_ms=request.signed_at_ms,
                nonce=request.nonce,
                signature=request.signature,
            )
            return wire.SecretResponse(jwe=jwe)

        await unary(stream, wire.SecretRequest, answer, most=self._most)

    async def call(self, stream: Stream[Any, Any]) -> None:
        # A module's gateway method: the control plane checks the certificate (when there is one) and its role.
        async def answer(request: wire.CallRequest) -> wire.CallResponse:
            output = await self._services.call(
                request.method,
                certificate_pem=client_certificate(stream, required=False),
                input=json_object(request.input_json, "input_json"),
            )
            return wire.CallResponse(output_json=json.dumps(output, separators=(",", ":")))

        await unary(stream, wire.CallRequest, answer, most=self._most)


def _certificate(result: JoinResult | RenewResult) -> wire.Certificate:
    """A joined or renewed node's certificate, as the wire carries it."""
    return wire.Certificate(
        node_id=result.node_id,
        spiffe_id=result.spiffe_id,
        certificate_pem=result.certificate_pem,
        chain_pem=result.chain_pem,
        trust_bundle_pem=result.trust_bundle_pem,
        serial=result.serial,
        not_after_ms=ms(result.not_after.timestamp()),
    )
