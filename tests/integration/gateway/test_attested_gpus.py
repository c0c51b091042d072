"""Who owns a GPU follows attested facts, not who reported it first (issue 30, item 7).

An attestor that verifies a machine's GPUs (here a stand-in for a GPU vendor's attestation: the vendor's key signs
the UUIDs bound to the key the node is certified for) records their UUIDs on the node. A node whose attestation
names a UUID another node holds without attestation takes it: the holder's device goes into conflict and the holder
is quarantined, and what its tenant reads names nothing of the other tenant. A claim only said, never attested,
never displaces anyone (``test_lifecycle.py``: the reporter is the one in conflict).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence

import attrs
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from bettercompute.errors import AccessDeniedError
from bettercompute.modules.inventory import ListDevicesInput
from bettercompute.modules.nodes import AttestationRequest, Attestor
from bettercompute.modules.pools import CreatePoolInput
from bettercompute_daemon.identity import NodeKey

from ..joins.conftest import claims
from .conftest import Joined, Wire
from .test_lifecycle import _devices, _report, conditions, node, settle

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

VENDOR = ed25519.Ed25519PrivateKey.generate()


def _statement(uuids: Sequence[str], key_sha256: str) -> bytes:
    return json.dumps({"uuids": list(uuids), "key": key_sha256}, sort_keys=True).encode()


def gpu_evidence(uuids: Sequence[str], key: NodeKey) -> dict[str, str]:
    """What the stand-in vendor attests for ``key``'s machine: its GPUs' UUIDs, signed."""
    spki = key.private_key.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    digest = hashlib.sha256(spki).hexdigest()  # as the CSR's key is named to attestors
    statement = _statement(uuids, digest)
    return {"gpu_attestation": base64.b64encode(statement + b"." + VENDOR.sign(statement).hex().encode()).decode()}


@attrs.frozen
class VendorGpuAttestor:
    """Records ``gpu_uuids`` for evidence the vendor signed for the key being certified; nothing without evidence."""

    name: str = "vendor-gpus"

    async def attest(self, request: AttestationRequest) -> Mapping[str, str]:
        raw = request.evidence.get("gpu_attestation")
        if raw is None:
            return {}
        statement, _, signature = base64.b64decode(raw).rpartition(b".")
        try:
            VENDOR.public_key().verify(bytes.fromhex(signature.decode()), statement)
        except (InvalidSignature, ValueError):
            raise AccessDeniedError("the GPU attestation does not verify", details={"reason": "bad_evidence"}) from None
        body = json.loads(statement)
        if body["key"] != request.csr_key_sha256:
            raise AccessDeniedError("the GPU attestation is for another key", details={"reason": "bad_evidence"})
        return {"gpu_uuids": ",".join(body["uuids"])}


@pytest.fixture
def attestors() -> Sequence[Attestor]:
    return (VendorGpuAttestor(),)


async def test_an_attested_gpu_is_taken_from_a_holder_that_only_said_it_had_it(gw: Wire) -> None:
    fleet = gw.fleet
    incumbent = await gw.join("SN-SAID")
    await _report(
        gw, incumbent, {"gpus": [{"uuid": "GPU-real", "model": "H100"}, {"uuid": "GPU-mine", "model": "H100"}]}
    )
    await settle(gw, incumbent.node_id, lambda n: "GpuHealthy" in conditions(n))
    assert await _devices(gw, incumbent.node_id) == {"GPU-real": "present", "GPU-mine": "present"}

    # The machine that has GPU-real joins in another tenant, its GPUs attested.
    theirs = await fleet.compute.api.pools.create(fleet.mallory, CreatePoolInput(tenant=fleet.globex, name="gpus"))
    token = await fleet.token(pool=theirs.id, by=fleet.mallory)
    key = NodeKey()
    result, _ = await fleet.join(
        token.token, key=key, hardware=claims("SN-ATTESTED"), evidence=gpu_evidence(["GPU-real"], key)
    )
    owner = Joined(
        node_id=result.node_id,
        key=key,
        certificate_pem=result.certificate_pem + result.chain_pem,
        trust_bundle_pem=result.trust_bundle_pem,
        serial=result.serial,
    )
    await _report(gw, owner, {"gpus": [{"uuid": "GPU-real", "model": "H100"}]})
    await settle(gw, owner.node_id, lambda n: "GpuHealthy" in conditions(n), by=fleet.mallory)
    assert await _devices(gw, owner.node_id) == {"GPU-real": "present"}

    # The one that only said it had it: its device in conflict, itself quarantined, the rest of it untouched.
    stopped = await settle(gw, incumbent.node_id, lambda n: n.state == "quarantined")
    assert stopped.state_reason == "duplicate_device"
    assert await _devices(gw, incumbent.node_id) == {"GPU-real": "conflict", "GPU-mine": "present"}
    listed = await fleet.compute.api.devices.list(fleet.alice, ListDevicesInput(tenant=fleet.acme))
    text = json.dumps(attrs.asdict(listed), default=str)
    assert owner.node_id not in text and fleet.globex not in text
    conflict = next(d for d in listed.devices if d.ident == "GPU-real")
    assert conflict.details.get("claimed_by_another_tenant") is True
    assert (await node(gw, owner.node_id, by=fleet.mallory)).state != "quarantined"


async def test_an_attestation_for_another_key_is_refused_at_the_join(gw: Wire) -> None:
    fleet = gw.fleet
    token = await fleet.token()
    with pytest.raises(AccessDeniedError):
        await fleet.join(token.token, hardware=claims("SN-STOLEN"), evidence=gpu_evidence(["GPU-x"], NodeKey()))


async def _attested_node(gw: Wire, serial: str, uuids: Sequence[str]) -> Joined:
    key = NodeKey()
    token = await gw.fleet.token()
    result, _ = await gw.fleet.join(token.token, key=key, hardware=claims(serial), evidence=gpu_evidence(uuids, key))
    return Joined(
        node_id=result.node_id,
        key=key,
        certificate_pem=result.certificate_pem + result.chain_pem,
        trust_bundle_pem=result.trust_bundle_pem,
        serial=result.serial,
    )


async def test_when_both_are_attested_the_holder_keeps_it_and_the_reporter_is_in_conflict(gw: Wire) -> None:
    first = await _attested_node(gw, "SN-FIRST", ["GPU-both"])
    await _report(gw, first, {"gpus": [{"uuid": "GPU-both", "model": "H100"}]})
    await settle(gw, first.node_id, lambda n: "GpuHealthy" in conditions(n))
    second = await _attested_node(gw, "SN-SECOND", ["GPU-both"])
    await _report(gw, second, {"gpus": [{"uuid": "GPU-both", "model": "H100"}]})
    claimed = await settle(gw, second.node_id, lambda n: "GpuHealthy" in conditions(n))
    assert conditions(claimed)["GpuHealthy"] == ("False", "DuplicateUuid")
    assert await _devices(gw, second.node_id) == {"GPU-both": "conflict"}
    assert await _devices(gw, first.node_id) == {"GPU-both": "present"}
