"""A gateway that holds no key: it enrols with a one-time token on the api's internal listener (gRPC over mutual TLS
on loopback), keeps its key and certificate in a state directory, and relays every join, renewal and session check
over that channel. The listener takes gateway certificates only, and the gateway trusts only a listener in role
``control``."""

from __future__ import annotations

import datetime as dt
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bettercompute.errors import AccessDeniedError, InvalidInputError, UnauthenticatedError, UnavailableError
from bettercompute.modules.nodes import GetNodeInput
from bettercompute_gateway import (
    GatewayIdentity,
    InternalListener,
    RemoteGatewayServices,
    create_gateway,
)
from bettercompute_gateway._internal import CALLER_CHECK_TTL, client_context, listen, listener_context

from .conftest import OPTIONS, Fleet, Wire, gateway_tls, hello, session_request

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

NAME = "gw-remote"
HOSTS = ("127.0.0.1", "localhost")


@attrs.define(kw_only=True)
class Remote:
    listener: InternalListener
    port: int
    token: str
    state: Path

    def identity(self, fleet: Fleet, *, token: str | None = None, state: Path | None = None) -> GatewayIdentity:
        return GatewayIdentity(
            state or self.state,
            name=NAME,
            hosts=HOSTS,
            addresses=[("127.0.0.1", self.port)],
            trust_domain=fleet.services.joins.ca.trust_domain,
            token=token,
        )


@pytest.fixture
async def remote(fleet: Fleet, tmp_path: Path) -> AsyncIterator[Remote]:
    listener = InternalListener(fleet.services, name="api-test", hosts=HOSTS)
    port = await listener.start("127.0.0.1", 0)
    assert fleet.services.enrolment is not None
    token = await fleet.services.enrolment.mint(NAME)
    try:
        yield Remote(listener=listener, port=port, token=token, state=tmp_path / "gateway-state")
    finally:
        await listener.close()


async def _gateway(fleet: Fleet, remote: Remote, tmp_path: Path) -> tuple[Wire, GatewayIdentity]:
    identity = remote.identity(fleet, token=remote.token)
    services, tls, _ = await identity.open()
    gateway = create_gateway(services, fleet.store, tls, OPTIONS, metrics=fleet.compute.metrics)
    port = await gateway.start("127.0.0.1", 0)
    folder = tmp_path / "clients"
    folder.mkdir(exist_ok=True)
    return Wire(fleet=fleet, gateway=gateway, port=port, trust_bundle_pem=tls.trust_bundle_pem, folder=folder), identity


async def test_a_node_joins_and_holds_a_session_through_a_gateway_that_holds_no_key(
    fleet: Fleet, remote: Remote, tmp_path: Path
) -> None:
    made, identity = await _gateway(fleet, remote, tmp_path)
    try:
        assert isinstance(identity.services, RemoteGatewayServices)
        assert not hasattr(identity.services, "joins")  # no CA, no JoinService, no KMS on this side
        joined = await made.join("SN-REMOTE-1")
        node = await fleet.compute.api.nodes.get(fleet.alice, _get(joined.node_id))
        assert node.id == joined.node_id and node.state == "adopting"
        channel = made.channel(joined)
        try:
            async with session_request(channel) as stream:
                await stream.send_request()
                await stream.send_message(hello(joined.node_id))
                frame = await stream.recv_message()
                assert frame is not None and frame.welcome is not None and frame.welcome.epoch >= 1
                await stream.end()
        finally:
            channel.close()
        # The gateway's certificate names it in role gateway, and its key is the one in its state directory.
        saved = (remote.state / "gateway.key").read_bytes()
        key = serialization.load_pem_private_key(saved, password=None)
        leaf = x509.load_pem_x509_certificate((remote.state / "gateway.pem").read_bytes())
        assert leaf.public_key().public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]
        assert (remote.state / "gateway.key").stat().st_mode & 0o077 == 0
        spiffe = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert f"spiffe://{fleet.services.joins.ca.trust_domain}/gateway/{NAME}" in [
            str(u) for u in spiffe.get_values_for_type(x509.UniformResourceIdentifier)
        ]
    finally:
        await made.gateway.close()
        identity.close()


def _get(node_id: str) -> GetNodeInput:
    return GetNodeInput(id=node_id)


async def test_an_enrolment_token_enrols_once_and_a_restart_needs_none(
    fleet: Fleet, remote: Remote, tmp_path: Path
) -> None:
    first = remote.identity(fleet, token=remote.token)
    await first.open()
    first.close()
    again = remote.identity(fleet, token=remote.token, state=tmp_path / "other-state")
    with pytest.raises(UnauthenticatedError) as replayed:
        await again.open()
    assert replayed.value.details["reason"] == "replayed"
    assert not (tmp_path / "other-state" / "gateway.key").exists()
    # The first gateway restarts with what it saved: no token needed.
    restarted = remote.identity(fleet, token=None)
    services, tls, _ = await restarted.open()
    try:
        assert await services.trust_bundle_pem() == tls.trust_bundle_pem
    finally:
        restarted.close()


async def test_an_expired_or_altered_token_or_another_pin_is_refused(
    fleet: Fleet, remote: Remote, tmp_path: Path
) -> None:
    assert fleet.services.enrolment is not None
    short = await fleet.services.enrolment.mint("gw-late", ttl=dt.timedelta(seconds=30))
    fleet.clock.advance(dt.timedelta(seconds=31))
    with pytest.raises(UnauthenticatedError) as expired:
        await remote.identity(fleet, token=short, state=tmp_path / "late").open()
    assert expired.value.details["reason"] == "expired"

    pin, sealed = remote.token.removeprefix("bcgw_").split(".")
    altered = "bcgw_" + pin + "." + sealed[:-6] + ("AAAAAA" if not sealed.endswith("AAAAAA") else "BBBBBB")
    with pytest.raises(UnauthenticatedError) as refused:
        await remote.identity(fleet, token=altered, state=tmp_path / "altered").open()
    assert refused.value.details["reason"] == "token"

    other_pin = "bcgw_" + "0" * 64 + "." + sealed
    with pytest.raises(UnauthenticatedError) as mismatch:
        await remote.identity(fleet, token=other_pin, state=tmp_path / "pin").open()
    assert mismatch.value.details["reason"] == "pin_mismatch"
    # The real token was never spent by any of these: it still enrols.
    await remote.identity(fleet, token=remote.token).open()


async def test_the_listener_takes_gateway_certificates_only(fleet: Fleet, remote: Remote, tmp_path: Path) -> None:
    made, identity = await _gateway(fleet, remote, tmp_path)
    try:
        joined = await made.join("SN-REMOTE-2")
    finally:
        await made.gateway.close()
        identity.close()
    bundle = await fleet.services.trust_bundle_pem()
    trust_domain = fleet.services.joins.ca.trust_domain
    as_node = RemoteGatewayServices(
        [("127.0.0.1", remote.port)],
        trust_domain=trust_domain,
        context=client_context(bundle, joined.certificate_pem, joined.key.private_key_pem().decode()),
    )
    anonymous = RemoteGatewayServices(
        [("127.0.0.1", remote.port)], trust_domain=trust_domain, context=client_context(bundle)
    )
    try:
        with pytest.raises(AccessDeniedError) as denied:
            await as_node.session_node(joined.certificate_pem)
        assert denied.value.details["reason"] == "role"
        with pytest.raises(UnauthenticatedError) as unauthenticated:
            await anonymous.session_node(joined.certificate_pem)
        assert unauthenticated.value.details["reason"] == "no_certificate"
    finally:
        as_node.close()
        anonymous.close()


async def test_a_gateway_refuses_a_listener_that_is_not_the_control_plane(fleet: Fleet, remote: Remote) -> None:
    # A listener with a gateway's certificate (what a compromised gateway could present): it chains to the bundle,
    # but it is not in role control.
    impostor_tls = await gateway_tls(fleet, name="gw-impostor")
    context = listener_context(
        impostor_tls.certificate_pem, impostor_tls.private_key_pem, impostor_tls.trust_bundle_pem
    )
    server, port = await listen(fleet.services, context, "127.0.0.1", 0)
    try:
        services = RemoteGatewayServices(
            [("127.0.0.1", port)],
            trust_domain=fleet.services.joins.ca.trust_domain,
            context=client_context(impostor_tls.trust_bundle_pem),
        )
        with pytest.raises(UnavailableError) as refused:
            await services.trust_bundle_pem()
        assert refused.value.details["reason"] == "untrusted_listener"
        services.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_renewal_over_the_channel_is_for_a_new_key_made_in_the_gateway(fleet: Fleet, remote: Remote) -> None:
    identity = remote.identity(fleet, token=remote.token)
    services, first, _ = await identity.open()
    try:
        renewed, _ = await identity.renew()
        assert renewed.private_key_pem != first.private_key_pem
        assert renewed.certificate_pem != first.certificate_pem
        assert (remote.state / "gateway.key").read_text() == renewed.private_key_pem
        # The channel now authenticates with the renewed certificate (a call that needs a gateway's certificate).
        assert await services.tunnel_check(["tun_unknown"]) == {"tun_unknown": "unknown"}
    finally:
        identity.close()


async def test_a_revoked_gateway_certificate_is_refused_once_the_last_check_has_lapsed(
    fleet: Fleet, remote: Remote
) -> None:
    identity = remote.identity(fleet, token=remote.token)
    services, tls, _ = await identity.open()
    try:
        # A call that needs a gateway's certificate: the malformed argument is refused only after the caller passed.
        with pytest.raises(InvalidInputError):
            await services.session_node("not a certificate")
        serial = x509.load_pem_x509_certificate(tls.certificate_pem.encode()).serial_number
        await fleet.services.joins.ca.revoke(serial, reason="gateway host lost")
        # Within the listener's reliance on its last check the gateway still gets through; once it lapses, not.
        fleet.clock.advance(CALLER_CHECK_TTL + dt.timedelta(seconds=1))
        with pytest.raises(UnauthenticatedError) as revoked:
            await services.session_node("not a certificate")
        assert revoked.value.details["reason"] == "certificate_revoked"
    finally:
        identity.close()


async def test_a_gateway_goes_on_through_another_listener_while_one_is_down(fleet: Fleet, remote: Remote) -> None:
    with socket.socket() as probe:  # a port nothing listens on: an api process that is down
        probe.bind(("127.0.0.1", 0))
        down = probe.getsockname()[1]
    identity = GatewayIdentity(
        remote.state,
        name=NAME,
        hosts=HOSTS,
        addresses=[("127.0.0.1", down), ("127.0.0.1", remote.port)],
        trust_domain=fleet.services.joins.ca.trust_domain,
        token=remote.token,
    )
    try:
        services, tls, _ = await identity.open()  # enrols through the second address
        assert await services.tunnel_check(["tun_unknown"]) == {"tun_unknown": "unknown"}
        only_down = RemoteGatewayServices(
            [("127.0.0.1", down)],
            trust_domain=fleet.services.joins.ca.trust_domain,
            context=client_context(tls.trust_bundle_pem, tls.certificate_pem, tls.private_key_pem),
        )
        with pytest.raises(UnavailableError) as none_left:
            await only_down.tunnel_check(["tun_unknown"])
        assert none_left.value.details["reason"] == "internal_channel"
        only_down.close()
    finally:
        identity.close()
