"""Commands and sessions against PostgreSQL, and the CommandSweeper: deadlines, sessions that die, re-dispatch
or failure as each command declares, events, and writes fenced by the sweeper's lease."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from bettercompute._runtime.jobs import _job_lease
from bettercompute.errors import FailedPreconditionError, InvalidInputError, NotFoundError
from bettercompute.modules.commands import COMMANDS, SESSIONS, CommandRecord, create_command, sweep_commands
from bettercompute.modules.nodes import NODES, NodeRecord
from tests._timing import deadline

from ..joins.conftest import Fleet, claims

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def _node(fleet: Fleet, serial: str = "SN-1") -> NodeRecord:
    token = await fleet.token()
    joined, _ = await fleet.join(token.token, hardware=claims(serial))
    node = await fleet.store.repository(NODES).get(joined.node_id)
    assert node is not None
    return node


async def _command(
    fleet: Fleet, node: NodeRecord, *, deadline_in: dt.timedelta = dt.timedelta(hours=1), **more: Any
) -> CommandRecord:
    signing = await fleet.signing()  # loaded before the transaction, as the control plane's jobs do
    async with fleet.store.transaction() as tx:
        return await create_command(
            tx,
            node=node,
            kind="diag.nvml",
            payload={"level": 1},
            deadline=fleet.clock.now() + deadline_in,
            signer=signing,
            **more,
        )


async def _state(fleet: Fleet, command: CommandRecord) -> tuple[str, str | None, int]:
    current = await fleet.store.repository(COMMANDS).get(command.id)
    assert current is not None
    return current.state, current.reason, current.attempts


async def _sweep(fleet: Fleet) -> int:
    return await sweep_commands(fleet.compute.context)


async def test_commands_past_their_deadline_expire_pending_or_dispatched(fleet: Fleet) -> None:
    node = await _node(fleet)
    session = await fleet.store.repository(SESSIONS).open(node_id=node.id, gateway="gw-1")
    waiting = await _command(fleet, node, deadline_in=dt.timedelta(seconds=30))
    sent = await _command(fleet, node, deadline_in=dt.timedelta(seconds=30))
    later = await _command(fleet, node, deadline_in=dt.timedelta(hours=1))
    dispatched = await fleet.store.repository(COMMANDS).dispatch(
        node_id=node.id, epoch=session.epoch, now=fleet.clock.now(), limit=1
    )
    assert [c.id for c in dispatched] == [waiting.id]
    assert await _sweep(fleet) == 0
    fleet.clock.advance(dt.timedelta(seconds=31))
    await fleet.store.repository(SESSIONS).seen([(node.id, session.epoch)], gateway="gw-1")
    assert await _sweep(fleet) == 2
    assert await _state(fleet, waiting) == ("expired", "deadline_exceeded", 1)
    assert await _state(fleet, sent) == ("expired", "deadline_exceeded", 0)
    assert (await _state(fleet, later))[0] == "pending"
    # The daemon's late answer changes nothing.
    late = await fleet.store.repository(COMMANDS).finish(
        id=waiting.id, epoch=session.epoch, state="succeeded", result={}, reason=None
    )
    assert late is None
    events = await fleet.events("command.expired")
    assert sorted(key for key, _ in events) == sorted([waiting.id, sent.id])
    assert all(payload["reason"] == "deadline_exceeded" for _, payload in events)
    assert await _sweep(fleet) == 0  # nothing twice


async def test_a_dead_session_re_dispatches_or_fails_each_command_as_it_declares(fleet: Fleet) -> None:
    node = await _node(fleet)
    first = await fleet.store.repository(SESSIONS).open(node_id=node.id, gateway="gw-1")
    again = await _command(fleet, node, on_session_loss="redispatch", max_attempts=2)
    once = await _command(fleet, node, on_session_loss="fail")
    now = fleet.clock.now()
    assert (
        len(await fleet.store.repository(COMMANDS).dispatch(node_id=node.id, epoch=first.epoch, now=now, limit=10)) == 2
    )
    assert await _sweep(fleet) == 0  # the session is alive
    assert await fleet.store.repository(SESSIONS).close(node_id=node.id, epoch=first.epoch)
    assert await _sweep(fleet) == 2
    assert await _state(fleet, again) == ("pending", None, 1)
    assert await _state(fleet, once) == ("failed", "session_lost", 1)
    assert [k for k, _ in await fleet.events("command.requeued")] == [again.id]
    assert [k for k, _ in await fleet.events("command.failed")] == [once.id]

    # The next session gets it again; when that one dies too, its two dispatches are spent.
    second = await fleet.store.repository(SESSIONS).open(node_id=node.id, gateway="gw-2")
    assert second.epoch == first.epoch + 1
    redone = await fleet.store.repository(COMMANDS).dispatch(node_id=node.id, epoch=second.epoch, now=now, limit=10)
    assert [c.id for c in redone] == [again.id] and redone[0].attempts == 2
    third = await fleet.store.repository(SESSIONS).open(node_id=node.id, gateway="gw-1")  # replaces the second
    assert await _sweep(fleet) == 1
    assert await _state(fleet, again) == ("failed", "attempts_exhausted", 2)
    # A result arriving over the replaced session is not taken.
    assert (
        await fleet.store.repository(COMMANDS).finish(
            id=again.id, epoch=second.epoch, state="succeeded", result={}, reason=None
        )
        is None
    )
    assert third.epoch == second.epoch + 1


async def test_a_session_its_gateway_stops_reporting_dies_after_the_session_timeout(fleet: Fleet) -> None:
    node = await _node(fleet)
    session = await fleet.store.repository(SESSIONS).open(node_id=node.id, gateway="gw-1")
    command = await _command(fleet, node, on_session_loss="redispatch")
    await fleet.store.repository(COMMANDS).dispatch(
        node_id=node.id, epoch=session.epoch, now=fleet.clock.now(), limit=10
    )
    timeout = fleet.compute.options.session_timeout
    fleet.clock.advance(timeout - dt.timedelta(seconds=5))
    assert await _sweep(fleet) == 0
    fleet.clock.advance(dt.timedelta(seconds=10))
    assert await _sweep(fleet) == 1
    assert await _state(fleet, command) == ("pending", None, 1)


async def test_a_finished_command_keeps_its_result_and_the_sweeper_leaves_it(fleet: Fleet) -> None:
    node = await _node(fleet)
    session = await fleet.store.repository(SESSIONS).open(node_id=node.id, gateway="gw-1")
    command = await _command(fleet, node)
    await fleet.store.repository(COMMANDS).dispatch(
        node_id=node.id, epoch=session.epoch, now=fleet.clock.now(), limit=10
    )
    done = await fleet.store.repository(COMMANDS).finish(
        id=command.id, epoch=session.epoch, state="succeeded", result={"gpus": 8}, reason=None
    )
    assert done is not None and done.state == "succeeded" and done.result == {"gpus": 8}
    await fleet.store.repository(SESSIONS).close(node_id=node.id, epoch=session.epoch)
    fleet.clock.advance(dt.timedelta(hours=2))
    assert await _sweep(fleet) == 0
    assert await _state(fleet, command) == ("succeeded", None, 1)


async def test_sessions_epochs_and_liveness(fleet: Fleet) -> None:
    node = await _node(fleet, "SN-1")
    other = await _node(fleet, "SN-2")
    a = await fleet.store.repository(SESSIONS).open(node_id=node.id, gateway="gw-1")
    b = await fleet.store.repository(SESSIONS).open(node_id=other.id, gateway="gw-1")
    assert (a.epoch, b.epoch) == (1, 1)
    # One statement for any number of sessions; a stale epoch or another gateway's claim does not count.
    current = await fleet.store.repository(SESSIONS).seen([(node.id, 1), (other.id, 1)], gateway="gw-1")
    assert sorted(current) == sorted([node.id, other.id])
    assert await fleet.store.repository(SESSIONS).seen([(node.id, 0), (other.id, 1)], gateway="gw-2") == []
    assert not await fleet.store.repository(SESSIONS).close(node_id=node.id, epoch=0)
    stored = await fleet.store.repository(NODES).get(node.id)
    assert stored is not None and stored.session_epoch == 1 and stored.last_seen_at is not None
    await fleet.services.joins.retire(other.id)
    with pytest.raises(NotFoundError):
        await fleet.store.repository(SESSIONS).open(node_id=other.id, gateway="gw-1")


async def test_the_sweepers_writes_are_fenced_by_its_lease(fleet: Fleet) -> None:
    node = await _node(fleet)
    command = await _command(fleet, node, deadline_in=dt.timedelta(seconds=1))
    fleet.clock.advance(dt.timedelta(seconds=2))
    leases = fleet.store.leases
    mine = await leases.acquire("controllers/command-sweeper", "worker-a", dt.timedelta(seconds=1))
    assert mine is not None
    # worker-a stalls past its TTL; worker-b takes the lease over.
    async with fleet.store.connection() as conn:
        await conn.execute(f"UPDATE \"{fleet.store.schema}\".leases SET expires_at = now() - interval '1 second'")
    assert await leases.acquire("controllers/command-sweeper", "worker-b", dt.timedelta(seconds=30)) is not None
    token = _job_lease.set(mine)
    try:
        with pytest.raises(FailedPreconditionError):
            await _sweep(fleet)
    finally:
        _job_lease.reset(token)
    assert (await _state(fleet, command))[0] == "pending"  # the stale holder wrote nothing


async def test_bad_command_declarations_are_refused(fleet: Fleet) -> None:
    node = await _node(fleet)
    bad_ones: list[dict[str, Any]] = [{"kind": "Not A Kind"}, {"on_session_loss": "retry"}, {"max_attempts": 0}]
    for bad in bad_ones:
        with pytest.raises(InvalidInputError):
            async with fleet.store.transaction() as tx:
                await create_command(
                    tx,
                    node=node,
                    payload={},
                    deadline=fleet.clock.now(),
                    signer=None,
                    **{"kind": "diag.nvml", **bad},
                )


async def test_started_controllers_run_the_sweeper_under_its_singleton_lease(fleet: Fleet) -> None:
    import anyio

    node = await _node(fleet)
    command = await _command(fleet, node, deadline_in=dt.timedelta(seconds=1))
    fleet.clock.advance(dt.timedelta(seconds=2))
    await fleet.compute.start({"controllers"})
    try:
        with anyio.fail_after(deadline(10)):
            while (await _state(fleet, command))[0] != "expired":  # noqa: ASYNC110 - polling the database
                await anyio.sleep(0.1)
        lease = await fleet.store.leases.get("controllers/command-sweeper")
        assert lease is not None and lease.holder == fleet.compute.context.instance
    finally:
        await fleet.compute.stop()
    assert await fleet.store.leases.get("controllers/command-sweeper") is None
