"""The internal channel: a gateway process asks the api process for what only keys can decide (``Join``, renewals,
secrets, module calls, tunnels, its own certificate), over gRPC with mutual TLS.

Both ends are here. ``InternalServices`` runs in the api process, in front of the control plane's
``GatewayServices``: it serves TLS with a certificate in role ``control`` and takes a client certificate in role
``gateway`` only (checked by the control plane at every call: chain, issuer, expiry, revocation, role), except for the
two calls a gateway makes before it has one, ``Enrol`` (with a one-time enrolment token) and ``TrustBundle`` (public).
``RemoteGatewayServices`` is the gateway's end: a ``GatewayServicesPort`` that holds no key but its own, and trusts
the listener only if its certificate chains to the trust bundle and names role ``control`` in the same trust domain.

Messages are JSON objects (``application/grpc+json``), one unary method per call; bytes travel as base64 and times as
milliseconds since the epoch. Every answer is ``{"ok": ...}`` or the project's error envelope ``{"error": ...}``, so
the gateway raises the same ``ComputeError`` the control plane did, with its code and details.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime as dt
import json
import logging
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpclib.client import Channel
from grpclib.const import Cardinality, Handler
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError, StreamTerminatedError
from grpclib.server import Server, Stream

from bettercompute.errors import (
    ComputeError,
    InternalError,
    InvalidInputError,
    UnauthenticatedError,
    UnavailableError,
    error_class_for_code,
)
from bettercompute.modules.nodes import JoinResult, RenewResult, ServerCertificate, TunnelGrant
from bettercompute.ports import Clock

from ._errors import STATUS_OF

if TYPE_CHECKING:
    from bettercompute.modules.nodes import GatewayServices

__all__ = [
    "MAX_MESSAGE_BYTES",
    "InternalListener",
    "InternalServices",
    "RemoteGatewayServices",
    "client_context",
    "listener_context",
]

log = logging.getLogger("bettercompute.gateway")

SERVICE = "/bettercompute.internal.v1.GatewayServices/"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest message either end reads (a module call's input or output is far smaller)."""
CALL_TIMEOUT = 30.0
"""How long the gateway waits for one answer before it gives up (``UNAVAILABLE``)."""
OPEN = frozenset({"Enrol", "TrustBundle"})
"""The calls a gateway makes before it has a certificate."""
CALLER_CHECK_TTL = dt.timedelta(seconds=5)
"""How long the listener relies on its last check of a gateway's certificate (chain, expiry, revocation,
role) before it asks the control plane again: a revoked gateway certificate is refused within this time."""
CALLER_CHECKS_KEPT = 256


class JsonCodec(CodecBase):
    """gRPC messages as JSON objects (``application/grpc+json``)."""

    __content_subtype__ = "json"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return json.dumps(message, separators=(",", ":"), ensure_ascii=True).encode()

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > MAX_MESSAGE_BYTES:
            raise GRPCError(STATUS_OF["INVALID_INPUT"], "message too large")
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise GRPCError(STATUS_OF["INVALID_INPUT"], "not JSON") from None
        if not isinstance(value, dict):
            raise GRPCError(STATUS_OF["INVALID_INPUT"], "not a JSON object")
        return value


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _ms(value: dt.datetime) -> int:
    return int(value.timestamp() * 1000)


def _time(value: Any) -> dt.datetime:
    return dt.datetime.fromtimestamp(int(value) / 1000, dt.UTC)


class _Request:
    """One request's fields, each checked for its type (``INVALID_INPUT`` naming the field)."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self._fields = fields

    def text(self, name: str, *, optional: bool = False) -> Any:
        value = self._fields.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise InvalidInputError(f"{name}: expected a string", details={"path": name})
        return value

    def data(self, name: str) -> bytes:
        try:
            return base64.b64decode(self.text(name), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidInputError(f"{name}: expected base64", details={"path": name}) from None

    def whole(self, name: str) -> int:
        value = self._fields.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 2**62:
            raise InvalidInputError(f"{name}: expected a whole number", details={"path": name})
        return value

    def object(self, name: str, *, optional: bool = False) -> Any:
        value = self._fields.get(name)
        if value is None and optional:
            return None
        if not isinstance(value, dict):
            raise InvalidInputError(f"{name}: expected an object", details={"path": name})
        return value

    def texts(self, name: str) -> list[str]:
        value = self._fields.get(name)
        if not isinstance(value, list) or len(value) > 1000 or not all(isinstance(v, str) for v in value):
            raise InvalidInputError(f"{name}: expected a list of strings", details={"path": name})
        return value


def _join_result(result: JoinResult) -> dict[str, Any]:
    return {
        "node_id": result.node_id,
        "tenant": result.tenant,
        "pool_id": result.pool_id,
        "spiffe_id": result.spiffe_id,
        "certificate_pem": result.certificate_pem,
        "chain_pem": result.chain_pem,
        "trust_bundle_pem": result.trust_bundle_pem,
        "serial": result.serial,
        "not_after_ms": _ms(result.not_after),
        "reclaimed": result.reclaimed,
    }


def _renew_result(result: RenewResult) -> dict[str, Any]:
    return {
        "node_id": result.node_id,
        "spiffe_id": result.spiffe_id,
        "certificate_pem": result.certificate_pem,
        "chain_pem": result.chain_pem,
        "trust_bundle_pem": result.trust_bundle_pem,
        "serial": result.serial,
        "not_after_ms": _ms(result.not_after),
    }


def _server_certificate(issued: ServerCertificate) -> dict[str, Any]:
    return {
        "certificate_pem": issued.certificate_pem,
        "chain_pem": issued.chain_pem,
        "trust_bundle_pem": issued.trust_bundle_pem,
        "not_before_ms": _ms(issued.not_before),
        "not_after_ms": _ms(issued.not_after),
    }


def _grant(grant: TunnelGrant) -> dict[str, Any]:
    return attrs.asdict(grant)


_Answer = Callable[["GatewayServices", _Request, str | None], Awaitable[Any]]


async def _join(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    result = await services.join(
        sealed_token=r.data("sealed_token"),
        csr_pem=r.text("csr_pem"),
        claims=r.object("claims"),
        evidence=r.object("evidence", optional=True),
        pool_id=r.text("pool_id", optional=True),
    )
    return _join_result(result)


async def _renew_challenge(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    return _b64(await services.renew_challenge(certificate_pem=r.text("certificate_pem")))


async def _renew(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    result = await services.renew(
        certificate_pem=r.text("certificate_pem"),
        challenge=r.data("challenge"),
        signature=r.data("signature"),
        csr_pem=r.text("csr_pem"),
    )
    return _renew_result(result)


async def _secret(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    return await services.secret(
        certificate_pem=r.text("certificate_pem"),
        name=r.text("name"),
        ephemeral_public_jwk=r.object("ephemeral_public_jwk"),
        signed_at_ms=r.whole("signed_at_ms"),
        nonce=r.data("nonce"),
        signature=r.data("signature"),
    )


async def _call(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    output = await services.call(
        r.text("method"), certificate_pem=r.text("certificate_pem", optional=True), input=r.object("input")
    )
    return dict(output)


async def _trust_bundle(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    return await services.trust_bundle_pem()


async def _session_node(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    return await services.session_node(r.text("certificate_pem"))


async def _renew_gateway(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    assert caller is not None  # checked before every call that is not open
    issued = await services.renew_gateway(caller, csr_pem=r.text("csr_pem"), hosts=r.texts("hosts"))
    return _server_certificate(issued)


async def _enrol(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    issued = await services.enrol_gateway(r.text("token"), csr_pem=r.text("csr_pem"), hosts=r.texts("hosts"))
    return _server_certificate(issued)


async def _tunnel_accept(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    return _grant(await services.tunnel_accept(r.text("ticket")))


async def _tunnel_node(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    return _grant(await services.tunnel_node(r.text("tunnel_id"), r.text("certificate_pem")))


async def _tunnel_check(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    return await services.tunnel_check(r.texts("ids"))


async def _tunnel_closed(services: GatewayServices, r: _Request, caller: str | None) -> Any:
    return await services.tunnel_closed(
        r.text("tunnel_id"), r.text("reason"), r.whole("bytes_up"), r.whole("bytes_down")
    )


ANSWERS: Mapping[str, _Answer] = {
    "Join": _join,
    "RenewChallenge": _renew_challenge,
    "Renew": _renew,
    "Secret": _secret,
    "Call": _call,
    "TrustBundle": _trust_bundle,
    "SessionNode": _session_node,
    "RenewGateway": _renew_gateway,
    "Enrol": _enrol,
    "TunnelAccept": _tunnel_accept,
    "TunnelNode": _tunnel_node,
    "TunnelCheck": _tunnel_check,
    "TunnelClosed": _tunnel_closed,
}


class InternalServices:
    """The api process's end of the internal channel: grpclib handlers in front of ``services``."""

    def __init__(self, services: GatewayServices) -> None:
        self._services = services
        self._checked: dict[bytes, tuple[str, dt.datetime]] = {}  # certificate DER -> (its PEM, relied on until)

    def __mapping__(self) -> dict[str, Handler]:
        return {
            SERVICE + name: Handler(self._handler(name, answer), Cardinality.UNARY_UNARY, dict, dict)
            for name, answer in ANSWERS.items()
        }

    def _handler(self, name: str, answer: _Answer) -> Callable[[Stream[Any, Any]], Awaitable[None]]:
        async def handle(stream: Stream[Any, Any]) -> None:
            request = await stream.recv_message()
            try:
                caller = None if name in OPEN else await self._caller(stream)
                reply: dict[str, Any] = {"ok": await answer(self._services, _Request(request or {}), caller)}
            except ComputeError as exc:
                reply = exc.to_envelope()
            except Exception as exc:  # nothing of it reaches the gateway; the class is logged
                log.error("internal channel: %s failed: %s", name, type(exc).__name__)
                reply = InternalError("the control plane failed unexpectedly").to_envelope()
            await stream.send_message(reply)

        return handle

    async def _caller(self, stream: Stream[Any, Any]) -> str:
        """The client certificate of the connection, as PEM, once the control plane says it is a gateway's."""
        der = _peer_der(stream)
        if der is None:
            raise UnauthenticatedError(
                "the internal channel needs a gateway's client certificate", details={"reason": "no_certificate"}
            )
        now = self._services.clock.now()
        known = self._checked.get(der)
        if known is not None and known[1] > now:
            return known[0]
        pem = x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM).decode()
        await self._services.gateway_of(pem)  # raises for a certificate that is not a valid gateway's
        if len(self._checked) >= CALLER_CHECKS_KEPT:
            self._checked = {k: v for k, v in self._checked.items() if v[1] > now}
            if len(self._checked) >= CALLER_CHECKS_KEPT:
                self._checked.clear()
        self._checked[der] = (pem, now + CALLER_CHECK_TTL)
        return pem


def _peer_der(stream: Any) -> bytes | None:
    """The DER of the certificate the other end of ``stream``'s connection presented, if any."""
    peer = stream.peer
    ssl_object = peer._transport.get_extra_info("ssl_object") if peer is not None else None
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    return bytes(der) if der else None


async def listen(services: GatewayServices, context: ssl.SSLContext, host: str, port: int) -> tuple[Server, int]:
    """Serve the internal channel on ``host:port`` with ``context`` (``listener_context``); the server and the port
    it bound."""
    server = Server([InternalServices(services)], codec=JsonCodec())
    await server.start(host, port, ssl=context)
    sockets = getattr(server._server, "sockets", None) or ()
    return server, int(sockets[0].getsockname()[1]) if sockets else port


def _load_chain(context: ssl.SSLContext, certificate_pem: str, private_key_pem: str) -> None:
    fd, path = tempfile.mkstemp(prefix="bc-internal-", suffix=".pem")
    try:
        with os.fdopen(fd, "w") as file:
            file.write(private_key_pem)
            file.write("\n")
            file.write(certificate_pem)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)


def listener_context(certificate_pem: str, private_key_pem: str, trust_bundle_pem: str) -> ssl.SSLContext:
    """The internal listener's TLS: TLS 1.2 or later, ALPN ``h2``, a client certificate optional at the handshake
    (``Enrol`` comes without one) and verified against the trust bundle whenever one is presented."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_OPTIONAL
    context.set_alpn_protocols(["h2"])
    context.load_verify_locations(cadata=trust_bundle_pem)
    _load_chain(context, certificate_pem, private_key_pem)
    return context


def client_context(
    trust_bundle_pem: str, certificate_pem: str | None = None, private_key_pem: str | None = None
) -> ssl.SSLContext:
    """The gateway's TLS towards the internal listener: the listener's certificate must chain to the trust bundle
    (its SPIFFE ID is checked apart, by ``RemoteGatewayServices``); the gateway's own certificate when it has one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False  # the listener is known by its SPIFFE ID (role control), not by a host name
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])
    context.load_verify_locations(cadata=trust_bundle_pem)
    if certificate_pem is not None and private_key_pem is not None:
        _load_chain(context, certificate_pem, private_key_pem)
    return context


def listener_spiffe_prefix(trust_domain: str) -> str:
    """What the internal listener's SPIFFE ID starts with."""
    return f"spiffe://{trust_domain}/control/"


def _spiffe_ids(der: bytes) -> list[str]:
    try:
        certificate = x509.load_der_x509_certificate(der)
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return []
    return [str(u) for u in names.get_values_for_type(x509.UniformResourceIdentifier)]


class _SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


Address = tuple[str, int]
"""An internal listener's ``(host, port)``."""


class RemoteGatewayServices:
    """The gateway's end of the internal channel: a ``GatewayServicesPort`` whose every answer comes from an api
    process's internal listener at one of ``addresses``. A call goes to the listener that answered last; when it
    cannot be reached (before anything was sent), the call goes to the next one, once around the list, so a gateway
    keeps working while one api process restarts. ``reload`` puts a renewed certificate to use; ``close`` ends the
    channels.

    Raises (every call): ``UnavailableError`` when no listener can be reached, the one reached does not answer within
    ``CALL_TIMEOUT``, or it is not the control plane (``untrusted_listener``); otherwise what the control plane raised.
    """

    def __init__(
        self,
        addresses: Sequence[Address],
        *,
        trust_domain: str,
        context: ssl.SSLContext,
        clock: Clock | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("no internal listener address")
        self._addresses = tuple(addresses)
        self._prefix = listener_spiffe_prefix(trust_domain)
        self._channels = self._open(context)
        self._current = 0
        self._retired: list[Channel] = []
        self._listeners: set[bytes] = set()  # the certificates of listeners found to be the control plane's
        self._clock = clock or _SystemClock()

    def __repr__(self) -> str:
        return f"RemoteGatewayServices({', '.join(f'{h}:{p}' for h, p in self._addresses)})"

    @property
    def clock(self) -> Clock:
        return self._clock

    def _open(self, context: ssl.SSLContext) -> list[Channel]:
        return [Channel(host, port, ssl=context, codec=JsonCodec()) for host, port in self._addresses]

    def reload(self, context: ssl.SSLContext) -> None:
        """Use ``context`` (a renewed certificate) for calls from now on; calls under way finish on the old one."""
        self._retired.extend(self._channels)
        while len(self._retired) > 2 * len(self._addresses):  # older ones have long had their answers
            self._retired.pop(0).close()
        self._channels = self._open(context)

    def close(self) -> None:
        """End the channels (and the ones ``reload`` retired)."""
        for channel in (*self._retired, *self._channels):
            channel.close()
        self._retired.clear()

    async def ask(self, name: str, request: Mapping[str, Any]) -> Any:
        """The control plane's answer to ``name`` (see ``ANSWERS``)."""
        start = self._current
        count = len(self._addresses)
        for step in range(count):
            index = (start + step) % count
            host, port = self._addresses[index]
            sent = False
            try:
                async with asyncio.timeout(CALL_TIMEOUT):
                    async with self._channels[index].request(
                        SERVICE + name, Cardinality.UNARY_UNARY, dict, dict
                    ) as stream:
                        await stream.send_request()
                        self._check_listener(stream)
                        sent = True
                        await stream.send_message(dict(request), end=True)
                        reply = await stream.recv_message()
            except ComputeError:
                raise
            except (TimeoutError, OSError, GRPCError, StreamTerminatedError, ssl.SSLError) as exc:
                log.warning("internal channel: %s to %s:%d failed: %s", name, host, port, type(exc).__name__)
                if not sent and step + 1 < count:
                    continue  # nothing reached this listener: the next one may answer
                raise UnavailableError(
                    "the control plane cannot be reached; try again", details={"reason": "internal_channel"}
                ) from None
            self._current = index
            if not isinstance(reply, dict):
                raise UnavailableError("the control plane gave no answer", details={"reason": "internal_channel"})
            if "error" in reply and isinstance(reply["error"], dict):
                raise _error(reply["error"])
            return reply.get("ok")
        raise UnavailableError("the control plane cannot be reached; try again", details={"reason": "internal_channel"})

    def _check_listener(self, stream: Any) -> None:
        der = _peer_der(stream)
        if der is not None and der in self._listeners:
            return
        if der is None or not any(i.startswith(self._prefix) for i in _spiffe_ids(der)):
            raise UnavailableError(
                "the internal listener is not the control plane's", details={"reason": "untrusted_listener"}
            )
        if len(self._listeners) >= 4 * len(self._addresses):  # listeners renew their certificates
            self._listeners.clear()
        self._listeners.add(der)

    # --- GatewayServicesPort ---------------------------------------------------------------------------------------

    async def join(
        self,
        *,
        sealed_token: bytes,
        csr_pem: str,
        claims: Mapping[str, Any],
        evidence: Mapping[str, Any] | None = None,
        pool_id: str | None = None,
    ) -> JoinResult:
        answer = await self.ask(
            "Join",
            {
                "sealed_token": _b64(sealed_token),
                "csr_pem": csr_pem,
                "claims": dict(claims),
                "evidence": dict(evidence) if evidence is not None else None,
                "pool_id": pool_id,
            },
        )
        return JoinResult(
            node_id=answer["node_id"],
            tenant=answer["tenant"],
            pool_id=answer["pool_id"],
            spiffe_id=answer["spiffe_id"],
            certificate_pem=answer["certificate_pem"],
            chain_pem=answer["chain_pem"],
            trust_bundle_pem=answer["trust_bundle_pem"],
            serial=answer["serial"],
            not_after=_time(answer["not_after_ms"]),
            reclaimed=bool(answer["reclaimed"]),
        )

    async def renew_challenge(self, *, certificate_pem: str) -> bytes:
        return base64.b64decode(await self.ask("RenewChallenge", {"certificate_pem": certificate_pem}))

    async def renew(self, *, certificate_pem: str, challenge: bytes, signature: bytes, csr_pem: str) -> RenewResult:
        answer = await self.ask(
            "Renew",
            {
                "certificate_pem": certificate_pem,
                "challenge": _b64(challenge),
                "signature": _b64(signature),
                "csr_pem": csr_pem,
            },
        )
        return RenewResult(
            node_id=answer["node_id"],
            spiffe_id=answer["spiffe_id"],
            certificate_pem=answer["certificate_pem"],
            chain_pem=answer["chain_pem"],
            trust_bundle_pem=answer["trust_bundle_pem"],
            serial=answer["serial"],
            not_after=_time(answer["not_after_ms"]),
        )

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
        return str(
            await self.ask(
                "Secret",
                {
                    "certificate_pem": certificate_pem,
                    "name": name,
                    "ephemeral_public_jwk": dict(ephemeral_public_jwk),
                    "signed_at_ms": signed_at_ms,
                    "nonce": _b64(nonce),
                    "signature": _b64(signature),
                },
            )
        )

    async def call(self, method: str, *, certificate_pem: str | None, input: Mapping[str, Any]) -> Mapping[str, Any]:
        answer = await self.ask("Call", {"method": method, "certificate_pem": certificate_pem, "input": dict(input)})
        return dict(answer)

    async def trust_bundle_pem(self) -> str:
        return str(await self.ask("TrustBundle", {}))

    async def session_node(self, certificate_pem: str) -> str:
        return str(await self.ask("SessionNode", {"certificate_pem": certificate_pem}))

    async def issue_server_certificate(self, csr_pem: str, *, name: str, hosts: Sequence[str]) -> ServerCertificate:
        """A renewed certificate for this gateway (the control plane names it after the certificate it holds now;
        ``name`` is what it expects)."""
        return _certificate(await self.ask("RenewGateway", {"csr_pem": csr_pem, "hosts": list(hosts)}))

    async def enrol(self, token: str, *, csr_pem: str, hosts: Sequence[str]) -> ServerCertificate:
        """This gateway's first certificate, for a one-time enrolment token."""
        return _certificate(await self.ask("Enrol", {"token": token, "csr_pem": csr_pem, "hosts": list(hosts)}))

    async def tunnel_accept(self, ticket: str) -> TunnelGrant:
        return TunnelGrant(**await self.ask("TunnelAccept", {"ticket": ticket}))

    async def tunnel_node(self, tunnel_id: str, certificate_pem: str) -> TunnelGrant:
        return TunnelGrant(**await self.ask("TunnelNode", {"tunnel_id": tunnel_id, "certificate_pem": certificate_pem}))

    async def tunnel_check(self, ids: Sequence[str]) -> dict[str, str]:
        return dict(await self.ask("TunnelCheck", {"ids": list(ids)}))

    async def tunnel_closed(self, tunnel_id: str, reason: str, bytes_up: int = 0, bytes_down: int = 0) -> bool:
        return bool(
            await self.ask(
                "TunnelClosed",
                {"tunnel_id": tunnel_id, "reason": reason, "bytes_up": bytes_up, "bytes_down": bytes_down},
            )
        )


def _certificate(answer: Mapping[str, Any]) -> ServerCertificate:
    return ServerCertificate(
        certificate_pem=answer["certificate_pem"],
        chain_pem=answer["chain_pem"],
        trust_bundle_pem=answer["trust_bundle_pem"],
        not_before=_time(answer["not_before_ms"]),
        not_after=_time(answer["not_after_ms"]),
    )


def _error(envelope: Mapping[str, Any]) -> ComputeError:
    """The control plane's error, raised again here with its code, message and details."""
    code = envelope.get("code")
    cls = error_class_for_code(code) if isinstance(code, str) else InternalError
    details = envelope.get("details")
    message = envelope.get("message")
    return cls(
        message if isinstance(message, str) else "the control plane refused",
        details=details if isinstance(details, dict) else None,
    )


class InternalListener:
    """The internal listener an api process runs: ``await start(host, port)`` (the port bound), ``await close()``.
    Its server certificate, in role ``control``, is issued by the CA in this process for a key made here, and renewed
    at two thirds of its life."""

    def __init__(self, services: GatewayServices, *, name: str, hosts: Sequence[str]) -> None:
        self._services = services
        self._name = name
        self._hosts = tuple(hosts)
        self._server: Server | None = None
        self._context: ssl.SSLContext | None = None
        self._renewer: asyncio.Task[None] | None = None

    async def _issue(self) -> tuple[str, str, str, float]:
        from cryptography.hazmat.primitives.asymmetric import ec

        from ._tls import csr_pem

        key = ec.generate_private_key(ec.SECP256R1())
        issued = await self._services.joins.ca.issue_server(
            csr_pem(key, self._name), name=self._name, hosts=self._hosts, role="control"
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        life = (issued.not_after - issued.not_before).total_seconds()
        bundle = await self._services.trust_bundle_pem()
        return issued.certificate_pem + issued.chain_pem, key_pem, bundle, max(60.0, life * 2 / 3)

    async def start(self, host: str, port: int) -> int:
        certificate, key, bundle, renew_in = await self._issue()
        self._context = listener_context(certificate, key, bundle)
        self._server, bound = await listen(self._services, self._context, host, port)
        self._renewer = asyncio.create_task(self._renew(renew_in), name="internal-listener-certificate")
        return bound

    async def _renew(self, delay: float) -> None:
        while True:
            await asyncio.sleep(delay)
            try:
                certificate, key, bundle, delay = await self._issue()
                if self._context is not None:
                    self._context.load_verify_locations(cadata=bundle)
                    _load_chain(self._context, certificate, key)
            except Exception as exc:  # the certificate in use is valid for a third of its life still
                log.warning("internal listener: certificate not renewed: %s", type(exc).__name__)
                delay = 60.0

    async def close(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()
