"""Keys rotate while nodes stay connected (issue 30, item 5; the part built so far: the instruction key and the node
CA, through the ``keys`` group).

Real ``bcd sim`` nodes hold their sessions over mutual TLS throughout. After each rotation the control plane's next
desired states are signed with the new key (or certified under the new CA's bundle) and every node applies and
acknowledges them; retiring the old instruction key signs again what it signed, so a node that reconnects later is
sent states it accepts. Rotations are root's alone, and audited.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bettercompute.errors import AccessDeniedError, FailedPreconditionError
from bettercompute.modules.audit import ListAuditInput
from bettercompute.modules.nodes import NODES, ListKeysInput, NodeRecord, RetireKeyInput, RotateKeyInput
from tests.integration.gateway.conftest import Wire
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

        # The CA rotates: the bundle carries both, and instructions still verify on every node.
        ca = await api.keys.rotate(fleet.root, RotateKeyInput(kind="ca"))
        assert ca.kind == "ca" and ca.state == "active"
        assert await _push(gw, nodes[1:], 2) == {new.id}
        await _all_acknowledged(gw, nodes)

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
