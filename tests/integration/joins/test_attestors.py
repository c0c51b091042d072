"""The attestor chain's plugin point: a host attestor's facts are recorded on the node, and its refusal (or its
crash) refuses the join with nothing written and no use spent. Also the nonce purge job."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import attrs
import pytest

from bettercompute.errors import AccessDeniedError, InternalError
from bettercompute.modules.nodes import NODES, AttestationRequest, Attestor, GetJoinTokenInput

from .conftest import Fleet, claims

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@attrs.define
class FakeTpm:
    """A fake TPM attestor (no TPM exists here): accepts evidence ``quote`` equal to ``good-<serial>``."""

    name: str = "tpm"
    seen: list[AttestationRequest] = attrs.field(factory=list)

    async def attest(self, request: AttestationRequest) -> Mapping[str, str]:
        self.seen.append(request)
        quote = request.evidence.get("quote")
        if quote == "crash":
            raise RuntimeError("the attestor's own bug, with a secret-looking detail 12345")
        if quote != f"good-{request.claims.serial}":
            raise AccessDeniedError("the TPM quote does not verify", details={"reason": "tpm_quote"})
        return {"verified": "yes", "ek": "ek-1"}


TPM = FakeTpm()


@pytest.fixture
def attestors() -> Sequence[Attestor]:
    TPM.seen.clear()
    return (TPM,)


async def test_a_host_attestor_runs_after_the_claims_attestor_and_its_facts_are_recorded(fleet: Fleet) -> None:
    created = await fleet.token(uses=3)
    result, _ = await fleet.join(created.token, hardware=claims("SN-1"), evidence={"quote": "good-SN-1"})
    node = await fleet.store.repository(NODES).get(result.node_id)
    assert node is not None and node.attestation == {"tpm.verified": "yes", "tpm.ek": "ek-1"}
    request = TPM.seen[-1]
    assert request.pool.id == fleet.pool and request.token.id == created.id and len(request.csr_key_sha256) == 64


async def test_a_refusing_or_crashing_attestor_refuses_the_join_and_writes_nothing(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    created = await fleet.token()
    with pytest.raises(AccessDeniedError) as refused:
        await fleet.join(created.token, evidence={"quote": "forged"})
    assert refused.value.details == {"reason": "tpm_quote"}
    with pytest.raises(InternalError) as crashed:
        await fleet.join(created.token, evidence={"quote": "crash"})
    assert "12345" not in str(crashed.value) and "12345" not in caplog.text
    token = await fleet.compute.api.join_tokens.get(fleet.alice, GetJoinTokenInput(id=created.id))
    assert token.uses_left == 1 and await fleet.store.repository(NODES).for_pool(fleet.pool) == []


async def test_expired_nonces_are_purged_by_the_controllers_job(fleet: Fleet) -> None:
    created = await fleet.token()
    await fleet.join(created.token, evidence={"quote": "good-SN-0001"})
    count = fleet.store.sql("SELECT count(*) AS n FROM {s}.replay_nonces")
    assert (await fleet.store.fetch(count, {}))[0].n == 1
    await fleet.compute.jobs.tick()
    assert (await fleet.store.fetch(count, {}))[0].n == 1  # still replayable: kept
    fleet.clock.advance(dt.timedelta(minutes=10))
    await fleet.compute.jobs.tick()
    assert (await fleet.store.fetch(count, {}))[0].n == 0
