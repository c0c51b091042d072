"""A real gateway on loopback with mutual TLS, in front of a control plane with JoinService on; its server
certificate comes from the control plane's CA, as the daemons' do. Clients are plain grpclib channels."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError

import bettercompute_proto as wire
from bettercompute.modules.nodes import NODES
from bettercompute_daemon.identity import NodeKey, join_binding, seal_token
from bettercompute_gateway import Gateway, GatewayOptions, GatewayTls, create_gateway

from ..joins.conftest import Fleet, attestors, certificate_ttl, claims, clock, fleet, kms, modules

__all__ = [
    "OPTIONS",
    "Fleet",
    "Wire",
    "attestors",
    "certificate_ttl",
    "claims",
    "clock",
    "envelope",
    "fleet",
    "gateway_tls",
    "kms",
    "modules",
]


def envelope(error: GRPCError) -> dict[str, Any]:
    """The project's error envelope a gRPC error carries as its message."""
    assert error.message is not None
    body: dict[str, Any] = json.loads(error.message)["error"]
    return body


@attrs.define(kw_only=True)
class Joined:
    node_id: str
    key: NodeKey
    certificate_pem: str
    trust_bundle_pem: str
    serial: str


@attrs.define(kw_only=True)
class Wire:
    """The gateway, the plane behind it, and clients as a daemon makes them."""

    fleet: Fleet
    gateway: Gateway
    port: int
    trust_bundle_pem: str
    folder: Path

    def context(
        self, joined: Joined | None = None, *, key_pem: bytes | None = None, cert_pem: str | None = None
    ) -> ssl.SSLContext:
        """A client TLS context trusting the control plane's CA, with a node's certificate when given."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=self.trust_bundle_pem)
        context.set_alpn_protocols(["h2"])
        if joined is not None or cert_pem is not None:
            cert = cert_pem if cert_pem is not None else joined.certificate_pem  # type: ignore[union-attr]
            key = key_pem if key_pem is not None else joined.key.private_key_pem()  # type: ignore[union-attr]
            path = self.folder / f"client-{len(list(self.folder.iterdir()))}.pem"
            path.write_bytes(key + b"\n" + cert.encode())
            path.chmod(0o600)
            context.load_cert_chain(path)
        return context

    def channel(self, joined: Joined | None = None, **kwargs: Any) -> Channel:
        return Channel("127.0.0.1", self.port, ssl=self.context(joined, **kwargs))

    async def join(
        self,
        serial: str = "SN-0001",
        *,
        uses: int = 1,
        reclaim: str = "none",
        pool: str | None = None,
        by: str | None = None,
    ) -> Joined:
        """``bcd join`` over the wire: a fresh key, its CSR, the token (of ``pool``, made by ``by``: see
        ``Fleet.token``) sealed to the published join key."""
        token = await self.fleet.token(uses=uses, reclaim=reclaim, pool=pool, by=by)
        key = NodeKey()
        csr_pem = key.csr_pem()
        hardware = claims(serial)
        sealed = seal_token(
            await self.fleet.join_key(),
            token.token,
            binding=join_binding(csr_pem, hardware),
            now=self.fleet.clock.now(),
        )
        channel = self.channel()
        try:
            reply = await wire.NodeStub(channel).join(
                wire.JoinRequest(sealed_token=sealed, csr_pem=csr_pem, claims_json=json.dumps(hardware))
            )
        finally:
            channel.close()
        cert = reply.certificate
        assert cert is not None
        return Joined(
            node_id=cert.node_id,
            key=key,
            certificate_pem=cert.certificate_pem + cert.chain_pem,  # as bcd keeps it: the leaf, then its chain
            trust_bundle_pem=cert.trust_bundle_pem,
            serial=cert.serial,
        )


def session_request(channel: Channel) -> Any:
    """A raw ``Session`` stream (``send_request`` first, then frames both ways)."""
    return channel.request(f"/{wire.SERVICE}/Session", Cardinality.STREAM_STREAM, wire.NodeFrame, wire.ControlFrame)


def signed_section(
    joined: Joined, name: str, content_json: str, *, epoch: int, fake: bool = False
) -> wire.InventorySection:
    """An inventory section signed by the node's key for session ``epoch``, as ``bcd`` sends it."""
    message = wire.inventory_section_message(section=name, content_json=content_json, fake=fake, epoch=epoch)
    return wire.InventorySection(
        section=name, content_json=content_json, fake=fake, epoch=epoch, signature=joined.key.sign(message)
    )


def signed_ack(joined: Joined, generation: int, *, epoch: int) -> wire.NodeFrame:
    """An acknowledgement of desired-state ``generation``, signed by the node's key for session ``epoch``."""
    message = wire.desired_ack_message(generation=generation, epoch=epoch)
    ack = wire.DesiredStateAck(observed_generation=generation, epoch=epoch, signature=joined.key.sign(message))
    return wire.NodeFrame(desired_state_ack=ack)


async def session_epoch(wired: Wire, node_id: str) -> int:
    """The epoch of the node's latest session (open once ``Welcome`` came)."""
    record = await wired.fleet.store.repository(NODES).get(node_id)
    assert record is not None
    return record.session_epoch


def hello(node_id: str) -> wire.NodeFrame:
    return wire.NodeFrame(hello=wire.Hello(node_id=node_id, session_nonce=b"n" * 16, software_version="test"))


async def gateway_tls(fleet: Fleet, name: str = "gw-test") -> GatewayTls:
    """A gateway server certificate from the plane's CA, for loopback."""
    ca = fleet.services.joins.ca
    key = ec.generate_private_key(ec.SECP256R1())
    csr_pem = NodeKey(key).csr_pem()
    issued = await ca.issue_server(csr_pem, name=name, hosts=["127.0.0.1", "localhost"])
    return GatewayTls(
        certificate_pem=issued.certificate_pem + issued.chain_pem,
        private_key_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
        trust_bundle_pem=await ca.trust_bundle_pem(),
    )


OPTIONS = GatewayOptions(name="gw-test", heartbeat_interval=1.0, liveness_flush_interval=0.2, hello_timeout=2.0)
"""The test gateway's options: short intervals, so that tests see liveness, timeouts and pushes quickly."""


@pytest.fixture
async def gw(fleet: Fleet, tmp_path: Path) -> AsyncIterator[Wire]:
    tls = await gateway_tls(fleet)
    gateway = create_gateway(
        fleet.services,
        fleet.store,
        tls,
        OPTIONS,
        notifier=fleet.compute.options.notifier,
        metrics=fleet.compute.metrics,
    )
    port = await gateway.start("127.0.0.1", 0)
    folder = tmp_path / "clients"
    folder.mkdir()
    made = Wire(fleet=fleet, gateway=gateway, port=port, trust_bundle_pem=tls.trust_bundle_pem, folder=folder)
    try:
        yield made
    finally:
        await made.gateway.close()  # a test may have replaced it (a gateway restart)
