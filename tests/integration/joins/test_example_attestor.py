"""The example attestor plugin (``examples/attestor``) in JoinService's chain: a machine with a proof made for its
serial and its key joins with the fact recorded; a missing proof, a proof for another key or another serial is
refused with nothing written and no use of the token spent."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bettercompute.errors import AccessDeniedError
from bettercompute.modules.nodes import NODES, Attestor, GetJoinTokenInput
from bettercompute_daemon.identity import NodeKey
from examples.attestor import ProvisioningAttestor, proof_for

from .conftest import Fleet, claims

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

SECRET = b"the operator's provisioning secret"


@pytest.fixture
def attestors() -> Sequence[Attestor]:
    return (ProvisioningAttestor(secret=SECRET),)


async def test_a_provisioned_machine_joins_and_any_other_proof_is_refused(fleet: Fleet) -> None:
    created = await fleet.token(uses=1)
    key, other = NodeKey(), NodeKey()
    refusals: dict[str, dict[str, str] | None] = {
        "no proof": None,
        "another key's proof": {"provisioning_proof": proof_for(SECRET, "SN-1", other.csr_pem())},
        "another serial's proof": {"provisioning_proof": proof_for(SECRET, "SN-2", key.csr_pem())},
        "another secret's proof": {"provisioning_proof": proof_for(b"guess", "SN-1", key.csr_pem())},
    }
    for case, evidence in refusals.items():
        with pytest.raises(AccessDeniedError) as refused:
            await fleet.join(created.token, key=key, hardware=claims("SN-1"), evidence=evidence)
        assert refused.value.details == {"reason": "provisioning_proof"}, case
    token = await fleet.compute.api.join_tokens.get(fleet.alice, GetJoinTokenInput(id=created.id))
    assert token.uses_left == 1 and await fleet.store.repository(NODES).for_pool(fleet.pool) == []

    proof = {"provisioning_proof": proof_for(SECRET, "SN-1", key.csr_pem())}
    result, _ = await fleet.join(created.token, key=key, hardware=claims("SN-1"), evidence=proof)
    node = await fleet.store.repository(NODES).get(result.node_id)
    assert node is not None and node.attestation == {"provisioning.proof": "verified"}
    assert SECRET.decode() not in repr(ProvisioningAttestor(secret=SECRET))
