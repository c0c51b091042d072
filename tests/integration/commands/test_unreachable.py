"""The SessionSweeper: a node with no live session for the session timeout is announced ``node.unreachable``
once per session, whether its gateway closed the session or died holding it; a retired node is not."""

from __future__ import annotations

import datetime as dt

import pytest

from bettercompute.modules.commands import NODE_UNREACHABLE, SESSION_CLOSED, SESSIONS, sweep_sessions
from bettercompute.modules.nodes import NODES, NodeRecord

from ..joins.conftest import Fleet, claims

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def _node(fleet: Fleet, serial: str) -> NodeRecord:
    joined, _ = await fleet.join((await fleet.token()).token, hardware=claims(serial))
    node = await fleet.store.repository(NODES).get(joined.node_id)
    assert node is not None
    return node


async def _sweep(fleet: Fleet) -> int:
    return await sweep_sessions(fleet.compute.context)


async def test_a_node_whose_gateway_died_is_unreachable_once_and_its_session_closed(fleet: Fleet) -> None:
    node = await _node(fleet, "SN-1")
    sessions = fleet.store.repository(SESSIONS)
    held = await sessions.open(node_id=node.id, gateway="gw-1")
    timeout = fleet.compute.options.session_timeout
    fleet.clock.advance(timeout - dt.timedelta(seconds=5))
    assert await _sweep(fleet) == 0  # not quiet long enough
    fleet.clock.advance(dt.timedelta(seconds=10))
    assert await _sweep(fleet) == 1
    unreachable = await fleet.events(NODE_UNREACHABLE)
    assert [k for k, _ in unreachable] == [node.id]
    payload = unreachable[0][1]
    assert payload["epoch"] == held.epoch and payload["gateway"] == "gw-1" and payload["last_seen_at"]
    closed = await fleet.events(SESSION_CLOSED)
    assert [(k, p["reason"], p["epoch"]) for k, p in closed] == [(node.id, "gateway_lost", held.epoch)]
    session = await sessions.get(node.id)
    assert session is not None and session.closed_at is not None
    # Once per session: nothing more, however long it stays away.
    fleet.clock.advance(dt.timedelta(hours=1))
    assert await _sweep(fleet) == 0
    assert len(await fleet.events(NODE_UNREACHABLE)) == 1

    # Its next session clears the mark: when that one goes quiet too, it is announced again.
    again = await sessions.open(node_id=node.id, gateway="gw-2")
    assert await _sweep(fleet) == 1
    unreachable = await fleet.events(NODE_UNREACHABLE)
    assert [(k, p["epoch"]) for k, p in unreachable] == [(node.id, held.epoch), (node.id, again.epoch)]


async def test_a_session_closed_by_its_gateway_makes_the_node_unreachable_after_the_timeout(fleet: Fleet) -> None:
    node = await _node(fleet, "SN-1")
    sessions = fleet.store.repository(SESSIONS)
    session = await sessions.open(node_id=node.id, gateway="gw-1")
    assert await sessions.close(node_id=node.id, epoch=session.epoch)
    assert await _sweep(fleet) == 0  # it may come back at once
    fleet.clock.advance(fleet.compute.options.session_timeout + dt.timedelta(seconds=5))
    assert await _sweep(fleet) == 1
    assert [k for k, _ in await fleet.events(NODE_UNREACHABLE)] == [node.id]
    assert await fleet.events(SESSION_CLOSED) == []  # its gateway announced that one


async def test_a_retired_node_is_not_announced(fleet: Fleet) -> None:
    node = await _node(fleet, "SN-1")
    sessions = fleet.store.repository(SESSIONS)
    await sessions.open(node_id=node.id, gateway="gw-1")
    await fleet.services.joins.retire(node.id)
    fleet.clock.advance(fleet.compute.options.session_timeout + dt.timedelta(seconds=5))
    assert await _sweep(fleet) == 1  # marked, so it is not looked at again
    assert await _sweep(fleet) == 0
    assert await fleet.events(NODE_UNREACHABLE) == []
