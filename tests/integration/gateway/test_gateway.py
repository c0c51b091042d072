"""The gateway over real mutual TLS on loopback: the relayed calls, sessions and their epochs, liveness in batches,
and the refusals, each with the project's error envelope, while the gateway keeps serving the others."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import struct
import time
from collections.abc import Awaitable, Callable

import anyio
import betterproto2
import pytest
from grpclib.client import Channel
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

import bettercompute_proto as wire
from bettercompute.modules.commands import COMMANDS, SESSIONS
from bettercompute.modules.nodes import NODES, RevokeNodeInput
from bettercompute_daemon.identity import NodeKey
from tests._timing import deadline

from .conftest import Joined, Wire, envelope, hello, session_epoch, session_request, signed_section

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def opened(stream: object) -> list[str]:
    """The kinds of the first two control frames (Welcome, then the inventory request)."""
    kinds = []
    for _ in range(2):
        frame = await stream.recv_message()  # type: ignore[attr-defined]
        assert frame is not None
        kinds.append(betterproto2.which_one_of(frame, "frame")[0])
    return kinds


async def start(stream: object, node_id: str) -> None:
    """Open a session for ``node_id`` on a new ``Session`` stream: ``Hello``, then ``Welcome`` and the inventory
    request."""
    await stream.send_request()  # type: ignore[attr-defined]
    await stream.send_message(hello(node_id))  # type: ignore[attr-defined]
    assert await opened(stream) == ["welcome", "inventory_request"]


async def refused(stream: object) -> tuple[str, GRPCError]:
    """A refused session as the daemon sees it: a ``Close`` frame with the reason, then, once it ends its side, the
    error status with the envelope."""
    frame = await stream.recv_message()  # type: ignore[attr-defined]
    assert frame is not None and frame.close is not None
    await stream.end()  # type: ignore[attr-defined]
    assert await stream.recv_message() is None  # type: ignore[attr-defined]
    with pytest.raises(GRPCError) as caught:
        await stream.recv_trailing_metadata()  # type: ignore[attr-defined]
    assert envelope(caught.value)["details"]["reason"] == frame.close.reason
    return frame.close.reason, caught.value


async def refused_session(channel: Channel, node_id: str) -> tuple[str, Status]:
    """Open a session on ``channel`` with ``Hello`` for ``node_id``, expecting a refusal: its reason and status."""
    try:
        async with session_request(channel) as stream:
            await stream.send_request()
            await stream.send_message(hello(node_id))
            reason, error = await refused(stream)
        return reason, error.status
    finally:
        channel.close()


async def test_a_machine_joins_over_the_wire_and_holds_a_session_whose_liveness_is_written(gw: Wire) -> None:
    joined = await gw.join()
    node = await gw.fleet.store.repository(NODES).get(joined.node_id)
    assert node is not None and node.state == "adopting"
    channel = gw.channel(joined)
    try:
        async with session_request(channel) as stream:
            await stream.send_request()
            await stream.send_message(hello(joined.node_id))
            welcome = await stream.recv_message()
            assert welcome is not None and welcome.welcome is not None
            assert welcome.welcome.epoch == 1 and welcome.welcome.heartbeat_interval_ms == 1000
            request = await stream.recv_message()
            assert request is not None and request.inventory_request is not None
            assert gw.gateway.sessions == {joined.node_id: 1}
            first = await gw.fleet.store.repository(SESSIONS).get(joined.node_id)
            assert first is not None and first.epoch == 1 and first.gateway == "gw-test" and first.closed_at is None
            await anyio.sleep(0.3)
            await stream.send_message(wire.NodeFrame(heartbeat=wire.Heartbeat(sent_at_ms=1)))
            with anyio.fail_after(deadline(5)):
                while True:
                    seen = await gw.fleet.store.repository(SESSIONS).get(joined.node_id)
                    assert seen is not None
                    if seen.last_seen_at > first.last_seen_at:
                        break
                    await anyio.sleep(0.05)
            await stream.end()
        with anyio.fail_after(deadline(5)):
            while gw.gateway.sessions:  # noqa: ASYNC110 - the gateway has no event for this; poll
                await anyio.sleep(0.05)
        closed = await gw.fleet.store.repository(SESSIONS).get(joined.node_id)
        assert closed is not None and closed.closed_at is not None
        opened_events = await gw.fleet.events("node.session_opened")
        assert opened_events == [(joined.node_id, {"node_id": joined.node_id, "epoch": 1, "gateway": "gw-test"})]
        closed_events = await gw.fleet.events("node.session_closed")
        assert [(key, p["epoch"], p["reason"]) for key, p in closed_events] == [(joined.node_id, 1, "left")]
    finally:
        channel.close()


async def test_a_second_session_of_a_node_closes_the_first_and_takes_the_next_epoch(gw: Wire) -> None:
    joined = await gw.join()
    first_channel, second_channel = gw.channel(joined), gw.channel(joined)
    try:
        async with session_request(first_channel) as first:
            await start(first, joined.node_id)
            async with session_request(second_channel) as second:
                await second.send_request()
                await second.send_message(hello(joined.node_id))
                frame = await second.recv_message()
                assert frame is not None and frame.welcome is not None and frame.welcome.epoch == 2
                assert (await second.recv_message()).inventory_request is not None
                close = await first.recv_message()
                assert close is not None and close.close is not None and close.close.reason == "superseded"
                await first.end()
                assert await first.recv_message() is None  # then the stream ends with an OK status
                assert gw.gateway.sessions == {joined.node_id: 2}
                await second.end()
                assert await second.recv_message() is None
        with anyio.fail_after(deadline(5)):
            while len(closed := await gw.fleet.events("node.session_closed")) < 2:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert sorted((p["epoch"], p["reason"]) for _, p in closed) == [(1, "superseded"), (2, "left")]
    finally:
        first_channel.close()
        second_channel.close()


async def test_a_session_needs_a_certificate_for_the_node_it_names(gw: Wire) -> None:
    joined = await gw.join("SN-0001")
    other = await gw.join("SN-0002")
    # No client certificate at all.
    assert await refused_session(gw.channel(), joined.node_id) == ("no_certificate", Status.UNAUTHENTICATED)
    # Another node's id in Hello.
    assert await refused_session(gw.channel(joined), other.node_id) == ("spiffe_id", Status.UNAUTHENTICATED)
    assert gw.gateway.sessions == {}


async def test_a_revoked_certificate_opens_no_session(gw: Wire) -> None:
    joined = await gw.join()
    await gw.fleet.services.joins.ca.revoke(joined.serial, reason="compromised")
    assert await refused_session(gw.channel(joined), joined.node_id) == ("certificate_revoked", Status.UNAUTHENTICATED)
    registry = gw.fleet.compute.metrics.registry
    assert registry.get_sample_value("bettercompute_gateway_handshakes_total", {"outcome": "unauthenticated"}) == 1
    assert registry.get_sample_value("bettercompute_gateway_handshakes_total", {"outcome": "ok"}) is None


async def test_a_certificate_of_another_ca_fails_the_handshake(gw: Wire, tmp_path: object) -> None:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = NodeKey()
    foreign = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "someone else's CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "node_x")]))
        .issuer_name(name)
        .public_key(x509.load_pem_x509_csr(key.csr_pem().encode()).public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .sign(foreign, hashes.SHA256())
    )
    channel = gw.channel(cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem=key.private_key_pem())
    try:
        with pytest.raises((ssl.SSLError, ConnectionError, StreamTerminatedError, GRPCError, OSError)):
            async with session_request(channel) as stream:
                await stream.send_request()
                await stream.send_message(hello("node_x"))
                await stream.recv_message()
    finally:
        channel.close()
    # The gateway still serves everyone else.
    joined = await gw.join()
    assert joined.node_id.startswith("node_")


async def test_a_renewal_over_the_wire_needs_proof_of_the_key(gw: Wire) -> None:
    joined = await gw.join()
    channel = gw.channel(joined)
    try:
        stub = wire.NodeStub(channel)
        challenge = (await stub.renew_challenge(wire.RenewChallengeRequest())).challenge
        new_key = NodeKey()
        csr_pem = new_key.csr_pem()
        # Signed by another key than the certificate's: refused.
        with pytest.raises(GRPCError) as caught:
            await stub.renew(
                wire.RenewRequest(
                    challenge=challenge, signature=new_key.renewal_proof(challenge, csr_pem), csr_pem=csr_pem
                )
            )
        assert caught.value.status == Status.UNAUTHENTICATED
        challenge = (await stub.renew_challenge(wire.RenewChallengeRequest())).challenge
        renewed = await stub.renew(
            wire.RenewRequest(
                challenge=challenge, signature=joined.key.renewal_proof(challenge, csr_pem), csr_pem=csr_pem
            )
        )
        assert renewed.certificate is not None and renewed.certificate.node_id == joined.node_id
        assert renewed.certificate.serial != joined.serial
    finally:
        channel.close()
    # Without a client certificate there is nothing to renew.
    channel = gw.channel()
    try:
        with pytest.raises(GRPCError) as caught:
            await wire.NodeStub(channel).renew_challenge(wire.RenewChallengeRequest())
        assert envelope(caught.value)["code"] == "UNAUTHENTICATED"
    finally:
        channel.close()


async def test_a_replayed_join_a_bad_request_and_a_token_for_another_pool_get_their_envelopes(gw: Wire) -> None:
    token = await gw.fleet.token(uses=2)
    key = NodeKey()
    csr_pem = key.csr_pem()
    from bettercompute_daemon.identity import join_binding, seal_token

    from .conftest import claims

    hardware = claims("SN-0009")
    sealed = seal_token(
        await gw.fleet.join_key(), token.token, binding=join_binding(csr_pem, hardware), now=gw.fleet.clock.now()
    )
    request = wire.JoinRequest(sealed_token=sealed, csr_pem=csr_pem, claims_json=json.dumps(hardware))
    channel = gw.channel()
    try:
        stub = wire.NodeStub(channel)
        await stub.join(request)
        with pytest.raises(GRPCError) as caught:
            await stub.join(request)
        assert caught.value.status == Status.UNAUTHENTICATED
        assert envelope(caught.value)["details"]["reason"] == "replayed"
        with pytest.raises(GRPCError) as caught:
            await stub.join(wire.JoinRequest(sealed_token=sealed, csr_pem=csr_pem, claims_json="[1, 2]"))
        assert caught.value.status == Status.INVALID_ARGUMENT
        assert envelope(caught.value)["details"]["path"] == "claims_json"

        # A token of one pool, sent by a machine meant for another: refused, and the token keeps its use.
        other = await gw.fleet.new_pool("other")
        fresh = await gw.fleet.token()
        aimed = seal_token(
            await gw.fleet.join_key(),
            fresh.token,
            binding=join_binding(csr_pem, hardware, None, other),
            now=gw.fleet.clock.now(),
        )
        with pytest.raises(GRPCError) as caught:
            await stub.join(
                wire.JoinRequest(sealed_token=aimed, csr_pem=csr_pem, claims_json=json.dumps(hardware), pool_id=other)
            )
        assert caught.value.status == Status.PERMISSION_DENIED
        assert envelope(caught.value)["details"]["reason"] == "wrong_pool"
        elsewhere = claims("SN-0010")
        right = seal_token(
            await gw.fleet.join_key(), fresh.token, binding=join_binding(csr_pem, elsewhere), now=gw.fleet.clock.now()
        )
        reply = await stub.join(
            wire.JoinRequest(sealed_token=right, csr_pem=csr_pem, claims_json=json.dumps(elsewhere))
        )
        assert reply.pool_id == gw.fleet.pool  # its one use was still there
    finally:
        channel.close()


async def test_garbage_and_oversized_frames_are_refused_and_others_are_served(gw: Wire) -> None:
    joined = await gw.join()
    channel = gw.channel(joined)
    try:
        for payload, status in (
            (b"\x00" + struct.pack(">I", 4) + b"\xff\xff\xff\xff", Status.INVALID_ARGUMENT),
            (b"\x00" + struct.pack(">I", 64 * 1024 * 1024), Status.RESOURCE_EXHAUSTED),
        ):
            # As a stream on the client's side, so that it may end without a message of its own making.
            async with channel.request(
                f"/{wire.SERVICE}/Join", Cardinality.STREAM_STREAM, wire.JoinRequest, wire.JoinResponse
            ) as stream:
                await stream.send_request()
                await stream._stream.send_data(payload)  # a frame no codec would make
                await stream.end()
                with pytest.raises(GRPCError) as caught:
                    await stream.recv_message()
            assert caught.value.status == status
    finally:
        channel.close()
    assert (await gw.join("SN-0002")).node_id != joined.node_id


async def test_a_tunnel_stream_that_opens_without_a_ticket_is_refused(gw: Wire) -> None:
    channel = gw.channel()
    try:
        async with channel.request(
            f"/{wire.SERVICE}/Tunnel", Cardinality.STREAM_STREAM, wire.TunnelFrame, wire.TunnelFrame
        ) as stream:
            await stream.send_request()
            await stream.send_message(wire.TunnelFrame(data=b"no ticket"))
            await stream.end()
            closing = await stream.recv_message()
            assert closing is not None and closing.close_reason == "protocol"
            assert await stream.recv_message() is None
            with pytest.raises(GRPCError) as caught:
                await stream.recv_trailing_metadata()
        assert caught.value.status == Status.INVALID_ARGUMENT
        assert envelope(caught.value)["details"]["reason"] == "protocol"
    finally:
        channel.close()


async def test_revoking_a_node_closes_its_live_session_within_two_seconds(gw: Wire) -> None:
    joined = await gw.join()
    channel = gw.channel(joined)
    try:
        async with session_request(channel) as stream:
            await start(stream, joined.node_id)
            revoked_at = time.monotonic()
            await gw.fleet.compute.api.nodes.revoke(gw.fleet.alice, RevokeNodeInput(id=joined.node_id))
            with anyio.fail_after(deadline(2)):
                frame = await stream.recv_message()
            assert frame is not None and frame.close is not None and frame.close.reason == "revoked"
            assert time.monotonic() - revoked_at < 2
            registry = gw.fleet.compute.metrics.registry
            assert registry.get_sample_value("bettercompute_gateway_revocations_applied_total") == 1
            assert registry.get_sample_value("bettercompute_gateway_handshakes_total", {"outcome": "ok"}) == 1
            await stream.end()
            assert await stream.recv_message() is None
        assert gw.gateway.sessions == {}
        assert gw.fleet.compute.metrics.registry.get_sample_value("bettercompute_gateway_sessions") == 0
    finally:
        channel.close()


async def test_a_command_reaches_the_node_and_only_its_signed_result_is_recorded(gw: Wire) -> None:
    joined = await gw.join()
    node = await gw.fleet.store.repository(NODES).get(joined.node_id)
    assert node is not None
    first = await gw.fleet.command(node, payload={"quick": True})
    second = await gw.fleet.command(node)
    channel = gw.channel(joined)
    try:
        async with session_request(channel) as stream:
            await start(stream, joined.node_id)
            sent: list[wire.Command] = []
            with anyio.fail_after(deadline(5)):
                while len(sent) < 2:
                    frame = await stream.recv_message()
                    assert frame is not None and frame.command is not None
                    sent.append(frame.command)
            # Made in one transaction, so at one time: their order is their ids'.
            sent.sort(key=lambda c: c.id != first.id)
            assert [c.id for c in sent] == [first.id, second.id]
            assert json.loads(sent[0].arguments_json) == {"quick": True} and sent[0].kind == "diag.nvml"

            def result(
                command: wire.Command, signer: NodeKey, *, epoch: int = 1, body: dict[str, object] | None = None
            ) -> wire.NodeFrame:
                text = json.dumps(body if body is not None else {"healthy": True})
                message = wire.command_result_message(
                    command_id=command.id, kind=command.kind, outcome="succeeded", result_json=text, epoch=epoch
                )
                return wire.NodeFrame(
                    command_result=wire.CommandResult(
                        command_id=command.id,
                        kind=command.kind,
                        outcome="succeeded",
                        result_json=text,
                        epoch=epoch,
                        signature=signer.sign(message),
                    )
                )

            # Signed by another key, signed for another session, or holding text the database cannot keep (a NUL):
            # each refused and logged, and the session goes on.
            await stream.send_message(result(sent[0], NodeKey()))
            await stream.send_message(result(sent[1], joined.key, epoch=7))
            await stream.send_message(result(sent[0], joined.key, body={"note": "a\u0000b"}))
            await stream.send_message(result(sent[1], joined.key))
            commands = gw.fleet.store.repository(COMMANDS)
            with anyio.fail_after(deadline(5)):
                while (done := await commands.get(second.id)) is None or done.state != "succeeded":  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            assert done.result == {"healthy": True}
            kept = await gw.fleet.store.repository(COMMANDS).get(first.id)
            assert kept is not None and kept.state == "dispatched"
            await stream.end()
            assert await stream.recv_message() is None
    finally:
        channel.close()


async def test_a_ramdisk_or_an_expired_certificate_opens_no_session(gw: Wire) -> None:
    joined = await gw.join()
    # A ramdisk certificate for the same node id: the right CA, the wrong role for a session.
    ramdisk_key = NodeKey()
    ramdisk = await gw.fleet.services.joins.ca.issue(ramdisk_key.csr_pem(), node_id=joined.node_id, role="ramdisk")
    assert await refused_session(
        gw.channel(cert_pem=ramdisk.certificate_pem + ramdisk.chain_pem, key_pem=ramdisk_key.private_key_pem()),
        joined.node_id,
    ) == ("role", Status.FAILED_PRECONDITION)
    # The node's own certificate once the control plane's clock is past its end.
    gw.fleet.clock.advance(dt.timedelta(hours=25))
    assert await refused_session(gw.channel(joined), joined.node_id) == ("certificate_expired", Status.UNAUTHENTICATED)
    assert gw.gateway.sessions == {}


async def closed_after(gw: Wire, change: Callable[[Joined], Awaitable[object]]) -> str:
    """Open a session, make ``change``, and return the reason of the ``Close`` frame that follows."""
    joined = await gw.join()
    channel = gw.channel(joined)
    try:
        async with session_request(channel) as stream:
            await start(stream, joined.node_id)
            await change(joined)
            await stream.send_message(wire.NodeFrame(heartbeat=wire.Heartbeat(sent_at_ms=1)))
            with anyio.fail_after(deadline(5)):
                frame = await stream.recv_message()
            assert frame is not None and frame.close is not None
            await stream.end()
            return str(frame.close.reason)
    finally:
        channel.close()


async def test_a_session_the_control_plane_gave_up_is_closed_so_the_daemon_starts_clean(gw: Wire) -> None:
    """As when the SessionSweeper closed it while this gateway could not reach the database."""

    async def give_up(joined: Joined) -> None:
        assert await gw.fleet.store.repository(SESSIONS).close(node_id=joined.node_id, epoch=1)

    assert await closed_after(gw, give_up) == "stale"


async def test_a_session_ends_when_the_certificate_it_opened_with_expires(gw: Wire) -> None:
    """The daemon renewed meanwhile; its next session opens with the new certificate."""

    async def expire(joined: Joined) -> None:
        gw.fleet.clock.advance(dt.timedelta(hours=25))

    assert await closed_after(gw, expire) == "certificate_expired"


async def test_inventory_sections_and_events_are_taken_in_and_bad_ones_dropped(gw: Wire) -> None:
    joined = await gw.join()
    gpus = [{"uuid": "GPU-1", "model": "H100"}]
    events = [
        wire.NodeEvent(type="gpu.xid", payload_json='{"xid": 79}', at_ms=5),
        wire.NodeEvent(type="Not A Type", payload_json="{}"),  # dropped
        wire.NodeEvent(type="gpu.xid", payload_json='{"x": "\\ud800"}'),  # an unpaired surrogate: dropped
    ]
    channel = gw.channel(joined)
    try:
        async with session_request(channel) as stream:
            await start(stream, joined.node_id)
            epoch = await session_epoch(gw, joined.node_id)
            altered = signed_section(joined, "disks", "[]", epoch=epoch)
            frames = [
                signed_section(joined, "gpus", json.dumps(gpus), epoch=epoch, fake=True),
                signed_section(joined, "../../etc", "{}", epoch=epoch),  # not a section: dropped
                signed_section(joined, "cpu", '{"model": "a\\u0000b"}', epoch=epoch),  # a NUL: dropped
                signed_section(joined, "memory", "{not json", epoch=epoch),  # dropped
                wire.InventorySection(section="nics", content_json="[]", epoch=epoch),  # unsigned: dropped
                signed_section(joined, "nics", "[]", epoch=epoch + 1),  # signed for another session: dropped
                wire.InventorySection(  # its signature is over other content: dropped
                    section="disks", content_json='[{"name": "sda"}]', epoch=epoch, signature=altered.signature
                ),
                signed_section(joined, "memory", '{"total_mib": 2048}', epoch=epoch),
            ]
            for section in frames:
                await stream.send_message(wire.NodeFrame(inventory=section))
            for event in events:
                await stream.send_message(wire.NodeFrame(event=event))
            await stream.send_message(wire.NodeFrame(heartbeat=wire.Heartbeat(sent_at_ms=1)))
            with anyio.fail_after(deadline(5)):
                while len(await gw.fleet.events("node.inventory_reported")) < 2:  # noqa: ASYNC110
                    await anyio.sleep(0.05)
            assert gw.gateway.sessions == {joined.node_id: 1}  # the session goes on
            await stream.end()
            assert await stream.recv_message() is None  # every frame was read before the stream ended
    finally:
        channel.close()
    kept = await gw.fleet.store.repository(NODES).inventory(joined.node_id)
    assert [(k.section, k.content, k.fake) for k in kept] == [
        ("gpus", gpus, True),
        ("memory", {"total_mib": 2048}, False),
    ]
    reported = await gw.fleet.events("node.reported")
    assert [(p["type"], p["payload"], p["at_ms"]) for _, p in reported] == [("gpu.xid", {"xid": 79}, 5)]
