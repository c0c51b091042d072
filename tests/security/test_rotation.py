"""Keys rotate while nodes stay connected and reservations flow (issue 30, item 5; the part built so far: the
instruction key, the node CA and JoinService's key, through the ``keys`` group).

Real ``bcd sim`` nodes hold their sessions over mutual TLS throughout. After each rotation the control plane's next
desired states are signed with the new key (or certified under the new CA's bundle) and every node applies and
acknowledges them; retiring the old instruction key signs again what it signed, so a node that reconnects later is
sent states it accepts. Rotations are root's alone, and audited.
"""

from __future__ import annotations

import datetime as dt
import shlex
from pathlib import Path
from typing import Any

import anyio
import pytest

from bettercompute.errors import AccessDeniedError, ComputeError, FailedPreconditionError, UnauthenticatedError
from bettercompute.modules.audit import ListAuditInput
from bettercompute.modules.nodes import NODES, ListKeysInput, NodeRecord, RetireKeyInput, RotateKeyInput
from bettercompute.modules.reservations import CreateReservationInput, ReservationsGroup
from bettercompute_daemon.identity import NodeKey, join_binding, seal_token
from tests.integration.gateway.conftest import Wire
from tests.integration.gateway.test_lifecycle import settle_reservation
from tests.integration.joins.conftest import claims
from tests.integration.sim.test_sim import all_in_session, join_flags, settle, sim, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def _all_acknowledged(gw: Wire, nodes: list[NodeRecord]) -> None:
    async def acknowledged() -> bool:
        for node in nodes:
            now = await gw.fleet.store.repository(NODES).get(node.id)
            if now is None or now.observed_generation != now.desired_generation:
                return False
        return True

    await wait_for(acknowledged)


async def _push(gw: Wire, nodes: list[NodeRecord], round: int) -> set[str]:
    """A new desired state for each node; the ids of the keys that signed them."""
    signers: set[str] = set()
    for node in nodes:
        desired = await gw.fleet.desire(node.id, {"allocations": [], "round": round})
        assert desired.instruction is not None
        signers.add(desired.instruction.signer)
    return signers


async def _reservation_runs(gw: Wire) -> None:
    """A reservation of one GPU on the simulated nodes' pool gets to ``active`` (bound on its node's acknowledgement
    of the desired state that carries it)."""
    group: ReservationsGroup[Any] = gw.fleet.compute.api.group(ReservationsGroup)
    made = await group.create(
        gw.fleet.alice, CreateReservationInput(tenant=gw.fleet.acme, pool_id=gw.fleet.pool, gpus=1, duration="PT1H")
    )
    assert made.state == "placed"
    active = await settle_reservation(gw, made.id, "active")
    assert [h.state for h in active.history] == ["placed", "bound", "active"]


async def _refusals(gw: Wire) -> list[dict[str, object]]:
    return [p["payload"] for _, p in await gw.fleet.events("node.reported") if p["type"] == "desired_state.refused"]


async def test_the_instruction_key_and_the_ca_rotate_while_nodes_stay_connected(gw: Wire, tmp_path: Path) -> None:
    fleet, api = gw.fleet, gw.fleet.compute.api
    state = str(tmp_path / "nodes")
    async with sim("--nodes", "3", "--seed", "31", "--state-dir", state, *await join_flags(gw, uses=3)) as running:
        await wait_for(lambda: all_in_session(gw, 3))
        nodes = sorted(await settle(gw, 3), key=lambda n: n.id)
        keys = (await api.keys.list(fleet.root, ListKeysInput())).keys
        assert {k.kind for k in keys} == {"ca", "instructions", "join"}
        [old] = [k for k in keys if k.kind == "instructions" and k.state == "active"]
        # The first node's state is signed by the old key and left so: the retire below must sign it again.
        assert await _push(gw, nodes[:1], 1) == {old.id}

        with pytest.raises(AccessDeniedError):  # a tenant's admin cannot
            await api.keys.rotate(fleet.alice, RotateKeyInput(kind="instructions"))
        new = await api.keys.rotate(fleet.root, RotateKeyInput(kind="instructions"))
        assert new.state == "active" and new.id != old.id
        assert await _push(gw, nodes[1:], 1) == {new.id}
        await _all_acknowledged(gw, nodes)
        # Reservations keep flowing: one binds only once its node applied a state signed with the new key.
        await _reservation_runs(gw)

        # The CA rotates: the bundle carries both, and instructions still verify on every node.
        ca = await api.keys.rotate(fleet.root, RotateKeyInput(kind="ca"))
        assert ca.kind == "ca" and ca.state == "active"
        assert await _push(gw, nodes[1:], 2) == {new.id}
        await _all_acknowledged(gw, nodes)
        await _reservation_runs(gw)

        # The old instruction key: not a day after its rotation without force; with it, what it signed is signed
        # again by the new key, at the same generation.
        with pytest.raises(FailedPreconditionError):
            await api.keys.retire(fleet.root, RetireKeyInput(kind="instructions", id=old.id))
        retired = await api.keys.retire(fleet.root, RetireKeyInput(kind="instructions", id=old.id, force=True))
        assert retired.state == "retired"
        [first] = await fleet.store.repository(NODES).desired_newer([(nodes[0].id, 0)])
        assert first.instruction is not None and first.instruction.signer == new.id
        assert first.generation == (await fleet.store.repository(NODES).get(nodes[0].id)).desired_generation  # type: ignore[union-attr]
        code, _, stderr = await running.stop()
        assert code == 0, stderr

    # The nodes come back (their state directories say where): each is sent its current state, all signed by the
    # new key, and refuses none.
    async with sim("--nodes", "3", "--state-dir", state) as again:
        await wait_for(lambda: all_in_session(gw, 3))
        assert await _push(gw, nodes, 3) == {new.id}
        await _all_acknowledged(gw, nodes)
        assert await _refusals(gw) == []
        code, _, stderr = await again.stop()
        assert code == 0, stderr

    audited = await api.audit.list(fleet.root, ListAuditInput(resource_type="key"))
    assert sorted(row.action for row in audited.entries if row.outcome != "denied") == [
        "compute:keys:retire",
        "compute:keys:rotate",
        "compute:keys:rotate",
    ]


async def test_a_join_sealed_to_the_previous_join_key_works_inside_the_overlap_and_fails_after(
    gw: Wire, tmp_path: Path
) -> None:
    """JoinService's key rotates with an overlap: a join command printed before the rotation still joins a real
    ``bcd`` inside it, a renewal challenge issued before the rotation is still good, and once the overlap has passed a
    token sealed to the old key is refused while one sealed to the new key joins."""
    fleet, api = gw.fleet, gw.fleet.compute.api
    old_key = await fleet.join_key()
    before = await fleet.token(uses=3)
    assert old_key in before.join_command
    joined, node_key = await fleet.join((await fleet.token()).token, hardware=claims("SN-ROT-0"))
    challenge = await fleet.services.renew_challenge(certificate_pem=joined.certificate_pem)

    rotated = await api.keys.rotate(fleet.root, RotateKeyInput(kind="join", overlap_seconds=600))
    new_key = await fleet.join_key()
    assert new_key != old_key and rotated.state == "active"
    assert new_key in (await fleet.token()).join_command
    listed = (await api.keys.list(fleet.root, ListKeysInput(kind="join"))).keys
    assert [(k.state, k.not_after is not None) for k in listed] == [("previous", True), ("active", False)]

    # Inside the overlap: the command printed before the rotation joins a real node.
    flags = shlex.split(before.join_command)
    flags[flags.index("--gateway") + 1] = f"127.0.0.1:{gw.port}"
    async with sim("--nodes", "1", "--state-dir", str(tmp_path / "old-command"), *flags[2:]) as running:

        async def in_session() -> bool:
            return len(gw.gateway.sessions) == 1

        await wait_for(in_session)
        code, summary, stderr = await running.stop()
    assert code == 0 and summary["joined"] == 1, stderr
    # Every process has read the rotation by now (they read the keys again within 5 seconds).
    fleet.clock.advance(dt.timedelta(seconds=10))
    csr = NodeKey()
    renewed = await fleet.renew(joined.certificate_pem, node_key, challenge, csr.csr_pem())
    assert renewed.serial != joined.serial

    # After it: sealed to the old key is refused as unopenable; sealed to the new one joins.
    fleet.clock.advance(dt.timedelta(seconds=601))
    key = NodeKey()
    hardware = claims("SN-ROT-1")
    csr_pem = key.csr_pem()
    stale = seal_token(old_key, before.token, binding=join_binding(csr_pem, hardware), now=fleet.clock.now())
    with pytest.raises(UnauthenticatedError) as refused:
        await fleet.services.join(sealed_token=stale, csr_pem=csr_pem, claims=hardware)
    assert refused.value.details["reason"] == "unopenable"
    result, _ = await fleet.join(before.token, key=key, hardware=hardware)
    assert result.node_id


async def test_the_instruction_key_s_certificate_is_renewed_while_nothing_is_signed(gw: Wire) -> None:
    """A quiet fleet still has a current signer certificate: the controllers' job renews it at half its life, so a
    node that reconnects after a quiet day is sent a state it accepts."""
    fleet = gw.fleet
    ending = fleet.store.sql(
        "UPDATE {s}.signing_keys SET certificate_not_after = now() + interval '1 hour' WHERE state = 'active' "
        "RETURNING id"
    )
    [row] = await fleet.store.fetch(ending, {})
    await fleet.compute.jobs.tick({"controllers"})
    [key] = [k for k in (await fleet.compute.api.keys.list(fleet.root, ListKeysInput(kind="instructions"))).keys]
    assert key.id == row.id and key.not_after is not None
    assert key.not_after - dt.datetime.now(dt.UTC) > dt.timedelta(hours=20)


async def test_a_burst_of_rotations_leaves_one_active_key_of_each_kind_and_bad_input_changes_nothing(gw: Wire) -> None:
    """More concurrent rotations than the store's pool holds: each answers (a JoinService rotation that raced another
    is ``CONFLICT``, to retry), none fails inside, and exactly one key of each kind is active after. Inputs that are
    not what they should be (NUL bytes, unpaired surrogates, full-width digits, bidirectional marks) are
    ``INVALID_INPUT`` over HTTP, and change no key."""
    fleet, api = gw.fleet, gw.fleet.compute.api
    outcomes: list[str] = []

    async def rotate(kind: str) -> None:
        try:
            await api.keys.rotate(fleet.root, RotateKeyInput(kind=kind))  # type: ignore[arg-type]
            outcomes.append("ok")
        except ComputeError as exc:
            outcomes.append(exc.code)

    async with anyio.create_task_group() as tg:
        for n in range(18):
            tg.start_soon(rotate, ("instructions", "join", "ca")[n % 3])
    assert set(outcomes) <= {"ok", "CONFLICT"} and outcomes.count("ok") >= 12
    keys = (await api.keys.list(fleet.root, ListKeysInput(limit=100))).keys
    # The CA's root and its active intermediate, and one key of each other kind.
    assert sorted((k.kind, k.issuer_id is None) for k in keys if k.state == "active") == [
        ("ca", False),
        ("ca", True),
        ("instructions", True),
        ("join", True),
    ]
    assert len({k.issuer_id for k in keys if k.kind == "ca" and k.issuer_id}) == 1  # every one under the same root

    auth = {"authorization": f"Bearer {fleet.root}", "content-type": "application/json"}
    # Raw JSON text, so that the escapes reach the server as a client could send them.
    bad = [
        ("keys/retire", r'{"kind": "instructions", "id": "sgk_\u0000"}'),
        ("keys/retire", r'{"kind": "instructions", "id": "sgk_\ud800"}'),
        ("keys/retire", r'{"kind": "instructions", "id": "sgk_\u202e0123"}'),
        ("keys/retire", r'{"kind": "nope", "id": "sgk_0123"}'),
        ("keys/rotate", r'{"kind": "join", "overlap_seconds": "\uff16\uff10"}'),
        ("keys/rotate", r'{"kind": "join", "overlap_seconds": 2592001}'),
        ("keys/rotate", r'{"kind": "join", "overlap_seconds": -1}'),
    ]
    for path, text in bad:
        answer = await fleet.http.post(f"/api/compute/{path}", headers=auth, content=text.encode())
        assert answer.status_code == 400, (text, answer.text)
        assert answer.json()["error"]["code"] == "INVALID_INPUT", answer.text
    after = (await api.keys.list(fleet.root, ListKeysInput(limit=100))).keys
    assert [(k.id, k.state) for k in after] == [(k.id, k.state) for k in keys]
