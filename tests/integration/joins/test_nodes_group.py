"""The ``nodes`` group over the API and HTTP: list and get joined machines, revoke a node's identity (then take it
back with a reclaiming token), retire a node; decided on the node's pool, audited, bad input refused."""

from __future__ import annotations

import pytest

from bettercompute.errors import AccessDeniedError, ConflictError, InvalidInputError, NotFoundError
from bettercompute.modules.nodes import GetNodeInput, ListNodesInput, RetireNodeInput, RevokeNodeInput

from .conftest import Fleet, claims

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_list_and_get_show_joined_nodes_to_their_tenant_only(fleet: Fleet) -> None:
    token = await fleet.token(uses=2)
    one, _ = await fleet.join(token.token, hardware=claims("SN-1"))
    other_pool = await fleet.new_pool("other")
    two, _ = await fleet.join((await fleet.token(pool=other_pool)).token, hardware=claims("SN-2"))
    api = fleet.compute.api.nodes
    listed = await api.list(fleet.alice, ListNodesInput(tenant=fleet.acme))
    assert [n.id for n in listed.nodes] == [one.node_id, two.node_id]
    assert [
        n.id for n in (await api.list(fleet.alice, ListNodesInput(tenant=fleet.acme, pool_id=other_pool))).nodes
    ] == [two.node_id]
    node = await api.get(fleet.alice, GetNodeInput(id=one.node_id))
    assert node.state == "adopting" and node.claims["serial"] == "SN-1" and node.pool_id == fleet.pool
    with pytest.raises(AccessDeniedError):
        await api.list(fleet.mallory, ListNodesInput(tenant=fleet.acme))
    with pytest.raises(NotFoundError):
        await api.get(fleet.mallory, GetNodeInput(id=one.node_id))
    response = await fleet.http.post(
        "/api/compute/nodes/get", headers={"authorization": f"Bearer {fleet.alice}"}, json={"id": "../x"}
    )
    assert response.status_code == 400 and response.json()["error"]["details"]["path"] == "id"
    # A tenant's caller cannot tell an unknown node from another tenant's: both are NOT_FOUND, as for pools.
    with pytest.raises(NotFoundError):
        await api.get(fleet.alice, GetNodeInput(id="node_missing"))
    with pytest.raises(InvalidInputError):  # the in-process api checks the input's type at run time too
        await api.retire(fleet.alice, {"id": "n", "reason": "x" * 501})  # type: ignore[arg-type]


async def test_revoke_cuts_a_node_and_a_reclaiming_token_takes_it_back(fleet: Fleet) -> None:
    first, _ = await fleet.join((await fleet.token()).token, hardware=claims("SN-7"))
    reclaiming = await fleet.token(reclaim="same-hardware")
    with pytest.raises(ConflictError):  # the node still holds a valid certificate
        await fleet.join(reclaiming.token, hardware=claims("SN-7"))
    revoked = await fleet.compute.api.nodes.revoke(fleet.alice, RevokeNodeInput(id=first.node_id, reason="re-image"))
    assert revoked.serials == (first.serial,) and await fleet.services.is_revoked(first.serial)
    again, _ = await fleet.join(reclaiming.token, hardware=claims("SN-7"))
    assert again.node_id == first.node_id and again.reclaimed
    rows = await fleet.store.fetch(
        fleet.store.sql("SELECT action, actor, details FROM {s}.audit WHERE resource_type = 'node' ORDER BY id"), {}
    )
    assert [r.action for r in rows] == ["compute:nodes:join", "compute:nodes:revoke", "compute:nodes:join"]
    assert rows[1].details["serials"] == [first.serial]


async def test_retire_ends_a_node_and_its_hardware_joins_again_as_a_new_node(fleet: Fleet) -> None:
    first, _ = await fleet.join((await fleet.token()).token, hardware=claims("SN-8"))
    with pytest.raises(ConflictError):
        await fleet.join((await fleet.token()).token, hardware=claims("SN-8"))
    retired = await fleet.compute.api.nodes.retire(fleet.alice, RetireNodeInput(id=first.node_id))
    assert retired.state == "retired" and retired.retired_at is not None
    assert await fleet.services.is_revoked(first.serial)
    with pytest.raises(NotFoundError):
        await fleet.compute.api.nodes.retire(fleet.mallory, RetireNodeInput(id=first.node_id))
    again, _ = await fleet.join((await fleet.token()).token, hardware=claims("SN-8"))
    assert again.node_id != first.node_id
