"""Desired state over the wire: a change reaches the node's live session (by polling, and at once on a notifier
poke), a new session gets the current one, the daemon's acknowledgement becomes ``observed_generation``; and a
daemon that stops reading is closed as ``slow`` without slowing anyone else."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import betterproto2
import psycopg
import pytest
from grpclib.client import Channel
from grpclib.config import Configuration
from grpclib.exceptions import ProtocolError, StreamTerminatedError

import bettercompute_proto as wire
from bettercompute.errors import InvalidInputError, UnavailableError
from bettercompute.modules.nodes import (
    DESIRED_STATE_CHANNEL,
    NODES,
    DesiredState,
    GetNodeInput,
    poke_gateways,
    set_desired_state,
)
from bettercompute_gateway import GatewayOptions, create_gateway
from bettercompute_store_pg import PgNotifier
from tests._timing import deadline, eventually

from .conftest import Joined, Wire, gateway_tls, hello, session_epoch, session_request, signed_ack

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def _desire(gw: Wire, node_id: str, content: dict[str, Any]) -> DesiredState:
    return await gw.fleet.desire(node_id, content)


async def _next(stream: Any, kind: str, seconds: float = 10) -> Any:
    """The next control frame of ``kind``, skipping others (inventory requests, commands)."""
    with anyio.fail_after(deadline(seconds)):
        while True:
            frame = await stream.recv_message()
            assert frame is not None, f"the stream ended before a {kind} frame"
            got, content = betterproto2.which_one_of(frame, "frame")
            if got == kind:
                return content


async def _observed(gw: Wire, node_id: str, generation: int) -> None:
    with anyio.fail_after(deadline(10)):
        while True:
            node = await gw.fleet.store.repository(NODES).get(node_id)
            assert node is not None
            if node.observed_generation == generation:
                return
            await anyio.sleep(0.05)


async def _listening(database_url: str, channel: str) -> None:
    """Wait until a connection has LISTENed on ``channel`` (PostgreSQL shows it as that connection's last statement):
    a poke sent before it would be lost."""

    async def found() -> bool:
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN ' || quote_ident(%s)", (channel,)
            )
            row = await cursor.fetchone()
        return row is not None and row[0] > 0

    await eventually(found, 10, f"a LISTEN on {channel}")


async def _open(stream: Any, joined: Joined) -> None:
    await stream.send_request()
    await stream.send_message(hello(joined.node_id))
    assert (await _next(stream, "welcome")).epoch >= 1


async def _closed_on(gw: Wire, gateway: str) -> list[tuple[str, str]]:
    """The sessions closed on ``gateway``, with their reasons."""
    return [(k, p["reason"]) for k, p in await gw.fleet.events("node.session_closed") if p["gateway"] == gateway]


ALLOCATION = {"allocations": [{"id": "alloc-1", "gpus": ["GPU-0000-aaaa"]}]}


async def test_a_desired_state_reaches_the_live_session_and_its_ack_is_recorded(gw: Wire) -> None:
    joined = await gw.join()
    before = await _desire(gw, joined.node_id, {"allocations": []})  # set while the node was away
    assert before.generation == 1
    channel = gw.channel(joined)
    try:
        async with session_request(channel) as stream:
            await _open(stream, joined)
            first = await _next(stream, "desired_state")  # a new session gets the current one
            assert (first.generation, json.loads(first.content_json)) == (1, {"allocations": []})
            await stream.send_message(signed_ack(joined, 1, epoch=await session_epoch(gw, joined.node_id)))
            await _observed(gw, joined.node_id, 1)

            changed = await _desire(gw, joined.node_id, ALLOCATION)
            pushed = await _next(stream, "desired_state")
            assert (pushed.generation, json.loads(pushed.content_json)) == (changed.generation, ALLOCATION)
            shown = await gw.fleet.compute.api.nodes.get(gw.fleet.alice, GetNodeInput(id=joined.node_id))
            assert (shown.desired_generation, shown.observed_generation, shown.desired_state_pending) == (2, 1, True)
            # An acknowledgement of a generation never sent is not taken.
            await stream.send_message(signed_ack(joined, 9, epoch=await session_epoch(gw, joined.node_id)))
            await stream.send_message(signed_ack(joined, 2, epoch=await session_epoch(gw, joined.node_id)))
            await _observed(gw, joined.node_id, 2)
            shown = await gw.fleet.compute.api.nodes.get(gw.fleet.alice, GetNodeInput(id=joined.node_id))
            assert (shown.desired_generation, shown.observed_generation, shown.desired_state_pending) == (2, 2, False)
            await stream.end()
    finally:
        channel.close()
    # The next session is sent the current generation, not the history.
    channel = gw.channel(joined)
    try:
        async with session_request(channel) as stream:
            await _open(stream, joined)
            assert (await _next(stream, "desired_state")).generation == 2
            await stream.end()
    finally:
        channel.close()


async def test_a_session_gets_each_generation_once_and_in_order(gw: Wire) -> None:
    # Every flush re-reads the changes of the last half minute: only the generation comparison keeps one already
    # sent from going down the session again, and an older one from following a newer.
    joined = await gw.join()
    channel = gw.channel(joined)
    generations: list[int] = []
    try:
        async with session_request(channel) as stream:
            await _open(stream, joined)
            contents: list[dict[str, Any]] = [{"allocations": []}, ALLOCATION, {"allocations": []}]
            for content in contents:
                await _desire(gw, joined.node_id, content)
            # About seven flushes (0.2 s apart), well inside the three silent heartbeats (1 s) that end a session.
            with anyio.move_on_after(1.5):
                while True:
                    frame = await stream.recv_message()
                    assert frame is not None
                    _, pushed = betterproto2.which_one_of(frame, "frame")
                    if isinstance(pushed, wire.DesiredState):
                        generations.append(pushed.generation)
            await stream.end()
    finally:
        channel.close()
    assert generations and generations[-1] == 3
    assert generations == sorted(set(generations)), generations


async def test_bad_desired_states_are_refused_with_nothing_written(gw: Wire) -> None:
    joined = await gw.join()
    for bad in ({"text": "a\x00b"}, {"\ud800": 1}, {"big": "x" * 300_000}, {"n": float("nan")}):
        with pytest.raises(InvalidInputError):
            await _desire(gw, joined.node_id, bad)
    node = await gw.fleet.store.repository(NODES).get(joined.node_id)
    assert node is not None and node.desired_generation == 0


async def test_a_desired_state_written_from_a_stale_read_of_its_node_is_refused(gw: Wire) -> None:
    """The generation a desired state is signed at is the node's next one as read; if another writer moved it since
    (the node was not read for update), the write is refused as retryable, and the newer state stands."""
    joined = await gw.join()
    stale = await gw.fleet.store.repository(NODES).get(joined.node_id)
    assert stale is not None
    await _desire(gw, joined.node_id, {"allocations": [{"id": "res_newer"}]})
    signing = await gw.fleet.signing()
    with pytest.raises(UnavailableError):
        async with gw.fleet.store.transaction() as tx:
            await set_desired_state(tx, stale, {"allocations": []}, signer=signing)
    current = await gw.fleet.store.repository(NODES).desired_newer([(joined.node_id, 0)])
    assert [(d.generation, dict(d.content)) for d in current] == [(1, {"allocations": [{"id": "res_newer"}]})]


@contextlib.asynccontextmanager
async def _poked_over_a_slow_flush(gw: Wire, database_url: str, name: str) -> AsyncIterator[tuple[Any, Joined]]:
    """A gateway of its own whose liveness flush (and desired-state polling) is a minute apart, with a notifier; a
    node's session on it, sent one desired state (generation 1) through the notifier's poke."""
    notifier = PgNotifier(database_url, schema=gw.fleet.store.schema)
    options = GatewayOptions(name=name, heartbeat_interval=30.0, liveness_flush_interval=60.0)
    tls = await gateway_tls(gw.fleet, name)
    slow = create_gateway(gw.fleet.services, gw.fleet.store, tls, options, notifier=notifier)
    port = await slow.start("127.0.0.1", 0)
    joined = await gw.join()
    channel = Channel("127.0.0.1", port, ssl=gw.context(joined))
    try:
        async with session_request(channel) as stream:
            await _open(stream, joined)
            await _listening(database_url, notifier.channel_name(DESIRED_STATE_CHANNEL))
            await _desire(gw, joined.node_id, ALLOCATION)
            await poke_gateways(notifier)
            assert (await _next(stream, "desired_state", seconds=15)).generation == 1
            yield stream, joined
            await stream.end()
    finally:
        channel.close()
        await slow.close()
        await notifier.close()


async def test_a_poke_pushes_at_once_when_polling_is_slow(gw: Wire, database_url: str) -> None:
    """With a flush a minute apart, only the notifier poke can bring the change within the wait."""
    async with _poked_over_a_slow_flush(gw, database_url, "gw-slow"):
        pass  # the change arrived within the wait (checked on the way in)


async def test_an_ack_is_recorded_at_once_when_the_liveness_flush_is_slow(gw: Wire, database_url: str) -> None:
    """With liveness flushed a minute apart, only the acknowledgement writer records the ack within the wait (a
    reservation binds on it: it used to wait for the next flush, a second by default)."""
    async with _poked_over_a_slow_flush(gw, database_url, "gw-acks") as (stream, joined):
        await stream.send_message(signed_ack(joined, 1, epoch=await session_epoch(gw, joined.node_id)))
        await _observed(gw, joined.node_id, 1)


async def test_a_daemon_that_stops_reading_is_closed_as_slow_and_others_are_not_held_up(
    gw: Wire, database_url: str
) -> None:
    options = GatewayOptions(name="gw-tight", heartbeat_interval=30.0, liveness_flush_interval=0.2, send_timeout=1.0)
    tls = await gateway_tls(gw.fleet, "gw-tight")
    tight = create_gateway(gw.fleet.services, gw.fleet.store, tls, options)
    port = await tight.start("127.0.0.1", 0)
    stuck, fine = await gw.join("SN-0001"), await gw.join("SN-0002")
    # It advertises a small receive window, as a daemon on a slow link would; one that stops reading its socket
    # altogether stalls the gateway's writes the same way (grpclib waits while the transport is paused).
    small = Configuration(http2_stream_window_size=64 * 1024, http2_connection_window_size=64 * 1024)
    stuck_channel = Channel("127.0.0.1", port, ssl=gw.context(stuck), config=small)
    fine_channel = Channel("127.0.0.1", port, ssl=gw.context(fine))
    big = {"allocations": [], "note": "x" * 150_000}
    checked = False
    try:
        # The stuck stream is ended by the gateway, not by this client: leaving it says so (ProtocolError).
        with contextlib.suppress(ProtocolError, StreamTerminatedError):
            async with session_request(stuck_channel) as jam:
                await _open(jam, stuck)
                async with session_request(fine_channel) as stream:
                    await _open(stream, fine)
                    # The stuck daemon reads nothing more: large states fill its window, so the gateway's sends
                    # must wait.
                    for _ in range(3):
                        await _desire(gw, stuck.node_id, big)
                        await anyio.sleep(0.3)
                    for generation in (1, 2, 3):
                        await _desire(gw, fine.node_id, {"allocations": [], "n": generation})
                        assert (await _next(stream, "desired_state")).generation == generation
                    with anyio.fail_after(deadline(10)):
                        while not (gone := await _closed_on(gw, "gw-tight")):  # noqa: ASYNC110 - polls the outbox
                            await anyio.sleep(0.05)
                    assert gone == [(stuck.node_id, "slow")]
                    assert stuck.node_id not in tight.sessions and fine.node_id in tight.sessions
                    await stream.end()
                    checked = True
        assert checked
    finally:
        stuck_channel.close()
        fine_channel.close()
        await tight.close()
