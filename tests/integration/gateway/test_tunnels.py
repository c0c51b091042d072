"""Tunnels end to end: ``nodes.tunnel`` hands out a ticket; a client presents it to a real gateway over TLS (no
client certificate); the node's agent (the ``bcd node`` loop, in process) is asked on its session, connects to a
TCP echo server on its loopback and opens its own stream on its session's channel; bytes flow both ways."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from grpclib.const import Cardinality, Status
from grpclib.exceptions import GRPCError

import bettercompute_proto as wire
from bettercompute.errors import AccessDeniedError
from bettercompute.modules.nodes import TUNNELS, RevokeNodeInput, TunnelNodeInput, TunnelOutput, sweep_tunnels
from bettercompute_cli._tunnel import serve_tunnel
from bettercompute_daemon._agent import Agent, join
from bettercompute_daemon._inventory import Inventory
from bettercompute_daemon._state import NodeConfig, StateDir
from bettercompute_gateway import GatewayOptions, TunnelOptions, create_gateway
from bettercompute_iam import DeleteBindingInput, IamGroups
from tests._timing import deadline, eventually

from ..iam.conftest import make_user
from ..joins.conftest import TRUST_DOMAIN
from .conftest import OPTIONS, Wire, envelope, gateway_tls

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@attrs.define
class Node:
    node_id: str
    agent: Agent
    task: asyncio.Task[int]


def fake_inventory(folder: Path, serial: str) -> Inventory:
    path = folder / f"inventory-{serial}.json"
    path.write_text(json.dumps({"claims": {"hostname": f"host-{serial.lower()}", "serial": serial}, "sections": {}}))
    return Inventory.load(path)


async def wait_for(check: Callable[[], bool], seconds: float = 10) -> None:
    with anyio.fail_after(deadline(seconds)):
        while not check():  # noqa: ASYNC110
            await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def node(gw: Wire, folder: Path, serial: str, ports: tuple[int, ...]) -> AsyncIterator[Node]:
    """A joined node whose agent holds its session with the gateway, allowing tunnels to ``ports`` on loopback."""
    token = await gw.fleet.token()
    inventory = fake_inventory(folder, serial)
    state = StateDir(folder / serial)
    config = NodeConfig(
        gateway=f"127.0.0.1:{gw.port}", trust_domain=TRUST_DOMAIN, pool=None, join_key=await gw.fleet.join_key()
    )
    identity = await join(
        state=state, token=token.token, config=config, bundle_pem=gw.trust_bundle_pem, inventory=inventory
    )
    agent = Agent(state, inventory, cdi_dir=None, tunnel_local_ports=ports)
    task = asyncio.create_task(agent.run())
    try:
        await wait_for(lambda: identity.node_id in gw.gateway.sessions)
        yield Node(node_id=identity.node_id, agent=agent, task=task)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    """A TCP echo server on 127.0.0.1; its port."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


@contextlib.asynccontextmanager
async def tunnel_stream(gw: Wire, ticket: str) -> AsyncIterator[Any]:
    """A client's ``Tunnel`` stream (no client certificate) that presented ``ticket``. A refusal the test read
    already (``refused``) is not raised again as the stream closes."""
    channel = gw.channel()
    request = channel.request(f"/{wire.SERVICE}/Tunnel", Cardinality.STREAM_STREAM, wire.TunnelFrame, wire.TunnelFrame)
    try:
        stream = await request.__aenter__()
        await stream.send_request()
        await stream.send_message(wire.TunnelFrame(ticket=ticket))
        try:
            yield stream
        except BaseException as exc:
            await request.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        if stream._end_done:  # a refusal read, or a tunnel ended cleanly: its status was read or is not wanted
            with contextlib.suppress(GRPCError):
                await request.__aexit__(None, None, None)
        else:  # left open: abandoned (reset), as a client that goes away does
            abandoned = asyncio.CancelledError()
            with contextlib.suppress(asyncio.CancelledError):
                await request.__aexit__(asyncio.CancelledError, abandoned, None)
    finally:
        channel.close()


async def exchange(stream: Any, payload: bytes) -> bytes:
    """Send ``payload`` in 64 KiB frames while reading what comes back, until as much came back."""

    async def send() -> None:
        for at in range(0, len(payload), 65536):
            await stream.send_message(wire.TunnelFrame(data=payload[at : at + 65536]))

    sending = asyncio.create_task(send())
    received = bytearray()
    try:
        while len(received) < len(payload):
            frame = await stream.recv_message()
            assert frame is not None and not frame.close_reason, frame
            received += frame.data
    finally:
        await sending
    return bytes(received)


async def close_reason(stream: Any) -> str:
    """Read until the gateway's closing frame; its reason."""
    while True:
        frame = await stream.recv_message()
        assert frame is not None, "the stream ended without a close reason"
        if frame.close_reason:
            return str(frame.close_reason)


async def ticket(gw: Wire, node_id: str, port: int, credential: str | None = None) -> TunnelOutput:
    opened: TunnelOutput = await gw.fleet.compute.api.nodes.tunnel(
        credential or gw.fleet.alice, TunnelNodeInput(node_id=node_id, port=port)
    )
    return opened


async def refused(stream: Any) -> GRPCError:
    """The refusal of a stream: a closing frame whose reason is the envelope's, then the status."""
    frame = await stream.recv_message()
    assert frame is not None and frame.close_reason and not frame.data
    await stream.end()
    assert await stream.recv_message() is None
    with pytest.raises(GRPCError) as caught:
        await stream.recv_trailing_metadata()
    assert envelope(caught.value)["details"]["reason"] == frame.close_reason
    return caught.value


async def test_bytes_flow_both_ways_through_a_tunnel_to_the_nodes_loopback(gw: Wire, tmp_path: Path) -> None:
    async with echo_server() as port, node(gw, tmp_path, "SN-T1", (port,)) as n:
        opened = await ticket(gw, n.node_id, port)
        assert opened.ticket.startswith(f"bctt_{opened.tunnel_id}.")
        assert opened.gateway == "gw.eu-1.example.com:443"
        assert "BEGIN CERTIFICATE" in opened.ca_pem
        async with tunnel_stream(gw, opened.ticket) as stream:
            assert await exchange(stream, b"hello") == b"hello"
            payload = os.urandom(1024 * 1024)
            assert await exchange(stream, payload) == payload
            assert list(gw.gateway.tunnels) == [opened.tunnel_id]
            registry = gw.fleet.compute.metrics.registry
            assert registry.get_sample_value("bettercompute_gateway_tunnels") == 1
            for direction in ("up", "down"):
                carried = registry.get_sample_value(
                    "bettercompute_gateway_tunnel_bytes_total", {"direction": direction}
                )
                assert carried == 1024 * 1024 + 5
            await stream.send_message(wire.TunnelFrame(close_reason="done"))
            assert await close_reason(stream) == "client_closed"
            await stream.end()
        await wait_for(lambda: not gw.gateway.tunnels)
        record = await gw.fleet.store.repository(TUNNELS).get(opened.tunnel_id)
        assert record is not None and record.close_reason == "client_closed"
        assert record.bytes_up == record.bytes_down == 1024 * 1024 + 5
        assert record.resource_type == "node" and record.action == "compute:nodes:tunnel"


async def test_a_ticket_is_spent_once(gw: Wire, tmp_path: Path) -> None:
    async with echo_server() as port, node(gw, tmp_path, "SN-T2", (port,)) as n:
        opened = await ticket(gw, n.node_id, port)
        async with tunnel_stream(gw, opened.ticket) as stream:
            assert await exchange(stream, b"once") == b"once"
            async with tunnel_stream(gw, opened.ticket) as again:
                error = await refused(again)
            assert error.status == Status.UNAUTHENTICATED
            assert envelope(error)["details"]["reason"] == "ticket"
        async with tunnel_stream(gw, opened.ticket.replace(".", ".x", 1)[:-1]) as forged:
            assert (await refused(forged)).status == Status.UNAUTHENTICATED


async def test_a_ticket_is_good_for_a_minute(gw: Wire, tmp_path: Path) -> None:
    async with node(gw, tmp_path, "SN-T15", (22,)) as n:
        opened = await ticket(gw, n.node_id, 22)
        gw.fleet.clock.advance(dt.timedelta(seconds=61))
        async with tunnel_stream(gw, opened.ticket) as stream:
            error = await refused(stream)
        assert error.status == Status.UNAUTHENTICATED


async def test_a_ticket_whose_caller_lost_the_action_is_refused_when_presented(gw: Wire, tmp_path: Path) -> None:
    plane: Any = attrs.make_class("P", ["compute", "root"])(gw.fleet.compute, gw.fleet.alice)
    _, credential, binding = await make_user(plane, gw.fleet.acme, "olga", "compute.operator")
    async with node(gw, tmp_path, "SN-T16", (22,)) as n:
        opened = await ticket(gw, n.node_id, 22, credential)
        await revoke_binding(gw, binding)
        async with tunnel_stream(gw, opened.ticket) as stream:
            error = await refused(stream)
        assert error.status == Status.PERMISSION_DENIED
        assert envelope(error)["details"]["reason"] == "access_revoked"
    record = await gw.fleet.store.repository(TUNNELS).get(opened.tunnel_id)
    assert record is not None and record.close_reason == "access_revoked"


async def test_a_port_the_node_does_not_allow_is_refused_by_the_node(gw: Wire, tmp_path: Path) -> None:
    async with echo_server() as port, node(gw, tmp_path, "SN-T3", ()) as n:
        opened = await ticket(gw, n.node_id, port)
        async with tunnel_stream(gw, opened.ticket) as stream:
            assert await close_reason(stream) == "target_refused"
            await stream.end()
        await wait_for(lambda: not gw.gateway.tunnels)
        record = await gw.fleet.store.repository(TUNNELS).get(opened.tunnel_id)
        assert record is not None and record.close_reason == "target_refused"


async def test_an_allowed_port_nothing_listens_on_is_unreachable(gw: Wire, tmp_path: Path) -> None:
    async with echo_server() as port:
        pass  # closed: nothing listens there now
    async with node(gw, tmp_path, "SN-T14", (port,)) as n:
        opened = await ticket(gw, n.node_id, port)
        async with tunnel_stream(gw, opened.ticket) as stream:
            assert await close_reason(stream) == "target_unreachable"
            await stream.end()


async def test_without_the_action_no_ticket_is_given(gw: Wire, tmp_path: Path) -> None:
    plane: Any = attrs.make_class("P", ["compute", "root"])(gw.fleet.compute, gw.fleet.alice)
    _, viewer, _ = await make_user(plane, gw.fleet.acme, "vic", "compute.member")
    async with node(gw, tmp_path, "SN-T4", (22,)) as n:
        with pytest.raises(AccessDeniedError):
            await ticket(gw, n.node_id, 22, viewer)


async def revoke_binding(gw: Wire, binding: str) -> None:
    await IamGroups(gw.fleet.compute.api).bindings.delete(
        gw.fleet.alice, DeleteBindingInput(tenant=gw.fleet.acme, binding_id=binding)
    )


async def revoke_key_elsewhere(gw: Wire, credential: str) -> None:
    """Revoke a credential in the database, as another control-plane process would: no cache here is told."""
    credential_id = credential.removeprefix("bcak_").split(".")[0]
    async with gw.fleet.store.connection() as conn:
        await conn.execute(
            f'UPDATE "{gw.fleet.store.schema}".iam_credentials SET revoked_at = now() WHERE id = %s', (credential_id,)
        )


@pytest.mark.parametrize(
    ("revoke", "reason"),
    [
        (lambda gw, binding, credential: revoke_binding(gw, binding), "access_revoked"),
        (lambda gw, binding, credential: revoke_key_elsewhere(gw, credential), "credential_revoked"),
    ],
    ids=["policy removed", "key revoked elsewhere"],
)
async def test_revoking_the_callers_access_closes_the_tunnel_within_two_seconds(
    gw: Wire, tmp_path: Path, revoke: Callable[[Wire, str, str], Awaitable[None]], reason: str
) -> None:
    plane: Any = attrs.make_class("P", ["compute", "root"])(gw.fleet.compute, gw.fleet.alice)
    _, credential, binding = await make_user(plane, gw.fleet.acme, "opal", "compute.operator")
    async with echo_server() as port, node(gw, tmp_path, "SN-T5", (port,)) as n:
        opened = await ticket(gw, n.node_id, port, credential)
        async with tunnel_stream(gw, opened.ticket) as stream:
            assert await exchange(stream, b"before") == b"before"
            await revoke(gw, binding, credential)
            with anyio.fail_after(deadline(2.0)):
                assert await close_reason(stream) == reason
            await stream.end()
        await wait_for(lambda: not gw.gateway.tunnels)


async def test_a_node_cannot_answer_another_nodes_tunnel(gw: Wire, tmp_path: Path) -> None:
    joined_b = await gw.join("SN-T6B")
    async with node(gw, tmp_path, "SN-T6A", ()) as a:
        opened = await ticket(gw, a.node_id, 22)
        channel = gw.channel(joined_b)
        try:
            async with channel.request(
                f"/{wire.SERVICE}/Tunnel", Cardinality.STREAM_STREAM, wire.TunnelFrame, wire.TunnelFrame
            ) as stream:
                await stream.send_request()
                await stream.send_message(wire.TunnelFrame(tunnel_id=opened.tunnel_id))
                error = await refused(stream)
        finally:
            channel.close()
        assert error.status == Status.PERMISSION_DENIED
        assert envelope(error)["details"]["reason"] == "wrong_tunnel"


@pytest.fixture
async def limited(gw: Wire) -> AsyncIterator[Wire]:
    """The test gateway, restarted with at most two tunnels per tenant sharing 512 KiB/s each way."""
    await gw.gateway.close()
    options = attrs.evolve(OPTIONS, tunnels=TunnelOptions(streams_per_tenant=2, bytes_per_second=512 * 1024))
    assert isinstance(options, GatewayOptions)
    gw.gateway = create_gateway(gw.fleet.services, gw.fleet.store, await gateway_tls(gw.fleet), options)
    await gw.gateway.start("127.0.0.1", gw.port)
    yield gw


async def test_a_tenant_holds_at_most_its_limit_of_tunnels(limited: Wire, tmp_path: Path) -> None:
    gw = limited
    async with (
        echo_server() as port,
        node(gw, tmp_path, "SN-T7", (port,)) as n,
        contextlib.AsyncExitStack() as stack,
    ):
        for index in range(2):
            stream = await stack.enter_async_context(tunnel_stream(gw, (await ticket(gw, n.node_id, port)).ticket))
            assert await exchange(stream, b"x%d" % index) == b"x%d" % index
        async with tunnel_stream(gw, (await ticket(gw, n.node_id, port)).ticket) as third:
            error = await refused(third)
        assert error.status == Status.RESOURCE_EXHAUSTED
        assert envelope(error)["details"]["reason"] == "tunnels_per_tenant"


async def test_a_tenants_tunnels_share_its_bandwidth(limited: Wire, tmp_path: Path) -> None:
    gw = limited
    async with echo_server() as port, node(gw, tmp_path, "SN-T11", (port,)) as n:
        opened = await ticket(gw, n.node_id, port)
        async with tunnel_stream(gw, opened.ticket) as stream:
            payload = os.urandom(1024 * 1024)
            started = time.monotonic()
            assert await exchange(stream, payload) == payload
            # A second's worth passes at once, the second half at 512 KiB/s.
            assert 0.9 <= time.monotonic() - started < 3.0
            await stream.send_message(wire.TunnelFrame(close_reason="done"))
            assert await close_reason(stream) == "client_closed"
            await stream.end()


async def test_revoking_the_node_closes_its_tunnels(gw: Wire, tmp_path: Path) -> None:
    async with echo_server() as port, node(gw, tmp_path, "SN-T12", (port,)) as n:
        opened = await ticket(gw, n.node_id, port)
        async with tunnel_stream(gw, opened.ticket) as stream:
            assert await exchange(stream, b"up") == b"up"
            await gw.fleet.compute.api.nodes.revoke(gw.fleet.alice, RevokeNodeInput(id=n.node_id))
            with anyio.fail_after(deadline(4)):
                assert await close_reason(stream) == "node_disconnected"
            await stream.end()


async def test_a_frame_over_64_kib_closes_the_tunnel(gw: Wire, tmp_path: Path) -> None:
    async with echo_server() as port, node(gw, tmp_path, "SN-T13", (port,)) as n:
        opened = await ticket(gw, n.node_id, port)
        async with tunnel_stream(gw, opened.ticket) as stream:
            assert await exchange(stream, b"small") == b"small"
            await stream.send_message(wire.TunnelFrame(data=b"x" * (64 * 1024 + 1024)))
            assert await close_reason(stream) == "protocol"
            await stream.end()


async def test_a_node_without_a_session_here_is_unavailable(gw: Wire) -> None:
    joined = await gw.join("SN-T8")
    opened = await ticket(gw, joined.node_id, 22)
    async with tunnel_stream(gw, opened.ticket) as stream:
        error = await refused(stream)
    assert error.status == Status.UNAVAILABLE
    assert envelope(error)["details"]["reason"] == "node_not_connected"


async def test_the_cli_listener_carries_each_local_connection_through_a_tunnel_of_its_own(
    gw: Wire, tmp_path: Path
) -> None:
    asked: list[str] = []

    async def ask() -> dict[str, Any]:
        opened = await ticket(gw, n.node_id, port)
        asked.append(opened.tunnel_id)
        return attrs.asdict(opened)

    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    async with echo_server() as port, node(gw, tmp_path, "SN-T9", (port,)) as n:
        listening = asyncio.create_task(
            serve_tunnel(ask, local_port=0, gateway=f"127.0.0.1:{gw.port}", ready=bound.set_result)
        )
        try:
            local = await bound
            for _ in range(2):
                reader, writer = await asyncio.open_connection("127.0.0.1", local)
                payload = os.urandom(300_000)
                writer.write(payload)
                assert await reader.readexactly(len(payload)) == payload
                writer.close()
            assert len(set(asked)) == 2  # a fresh ticket for each connection
            await wait_for(lambda: not gw.gateway.tunnels)
        finally:
            listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listening
    for tunnel_id in asked:
        # The gateway forgets a tunnel before it records the closing: on a busy machine the record lags a moment.
        async def closed(tunnel_id: str = tunnel_id) -> bool:
            record = await gw.fleet.store.repository(TUNNELS).get(tunnel_id)
            return record is not None and record.close_reason is not None

        await eventually(closed, 10, f"tunnel {tunnel_id} recorded as closed")
        record = await gw.fleet.store.repository(TUNNELS).get(tunnel_id)
        assert record is not None and record.close_reason == "client_closed" and record.bytes_down == 300_000


async def test_the_sweep_closes_unused_tickets_and_tunnels_no_gateway_carries(gw: Wire) -> None:
    joined = await gw.join("SN-T10")
    unused = await ticket(gw, joined.node_id, 22)
    lost = await ticket(gw, joined.node_id, 23)
    await gw.fleet.services.tunnel_accept(lost.ticket)  # spent by a gateway that then went away
    tunnels = gw.fleet.store.repository(TUNNELS)
    assert await sweep_tunnels(gw.fleet.store, now=gw.fleet.clock.now()) == 0
    gw.fleet.clock.advance(dt.timedelta(minutes=2))
    assert await sweep_tunnels(gw.fleet.store, now=gw.fleet.clock.now()) == 2
    closed = {
        t.id: t.close_reason for t in [await tunnels.get(unused.tunnel_id), await tunnels.get(lost.tunnel_id)] if t
    }
    assert closed == {unused.tunnel_id: "ticket_expired", lost.tunnel_id: "gateway_lost"}
    rows = await gw.fleet.store.fetch(
        gw.fleet.store.sql("SELECT details FROM {s}.audit WHERE details->>'event' = 'tunnel_closed'"), {}
    )
    assert [r.details["tunnel_id"] for r in rows] == [lost.tunnel_id]  # an unused ticket never opened anything
