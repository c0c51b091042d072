"""``gateway_services.secret``: a node's signed request, answered as JWE to its one-time key, only when entitled."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from joserfc.errors import DecodeError

from bettercompute.errors import AccessDeniedError, ComputeError, InvalidInputError, UnauthenticatedError
from bettercompute.modules.nodes import NODES, JoinResult
from bettercompute.modules.secrets import CreateSecretInput
from bettercompute_daemon.identity import EphemeralKey, NodeKey

from .conftest import Fleet, claims

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def _reason(exc: pytest.ExceptionInfo[ComputeError]) -> Any:
    return exc.value.details.get("reason")


async def _ask(
    fleet: Fleet,
    node: JoinResult,
    key: NodeKey,
    name: str,
    *,
    ephemeral: EphemeralKey | None = None,
    now: dt.datetime | None = None,
) -> tuple[str, EphemeralKey]:
    ephemeral = ephemeral or EphemeralKey()
    proof = key.secret_request(name, ephemeral, now=now or fleet.clock.now())
    answer = await fleet.services.secret(
        certificate_pem=node.certificate_pem,
        name=name,
        ephemeral_public_jwk=ephemeral.public_jwk(),
        signed_at_ms=proof.signed_at_ms,
        nonce=proof.nonce,
        signature=proof.signature,
    )
    return answer, ephemeral


async def _secret(fleet: Fleet, name: str, scope: str, value: str) -> None:
    await fleet.compute.api.secrets.create(
        fleet.alice, CreateSecretInput(tenant=fleet.acme, name=name, scope=scope, value=value)
    )


async def test_an_entitled_node_gets_the_secret_as_jwe_only_its_key_opens(fleet: Fleet) -> None:
    token = await fleet.token(uses=2)
    node, key = await fleet.join(token.token, hardware=claims("SN-1"))
    await _secret(fleet, "registry-password", f"pool:{fleet.pool}", "hunter2-for-the-pool")
    await _secret(fleet, "ipmi", f"node:{node.node_id}", "only-for-this-node")
    answer, ephemeral = await _ask(fleet, node, key, "registry-password")
    assert ephemeral.open(answer) == b"hunter2-for-the-pool"
    assert "hunter2" not in answer
    with pytest.raises(DecodeError):  # another key cannot open it
        EphemeralKey().open(answer)
    answer, ephemeral = await _ask(fleet, node, key, "ipmi")
    assert ephemeral.open(answer) == b"only-for-this-node"

    neighbour, neighbour_key = await fleet.join(token.token, hardware=claims("SN-2"))
    with pytest.raises(AccessDeniedError):
        await _ask(fleet, neighbour, neighbour_key, "ipmi")


async def test_a_request_not_signed_by_the_node_key_stale_or_replayed_is_refused(fleet: Fleet) -> None:
    token = await fleet.token()
    node, key = await fleet.join(token.token)
    await _secret(fleet, "db", f"pool:{fleet.pool}", "s3cr3t")

    thief = NodeKey()  # has the (public) certificate, not the key
    with pytest.raises(UnauthenticatedError) as forged:
        await _ask(fleet, node, thief, "db")
    assert _reason(forged) == "bad_signature"

    with pytest.raises(UnauthenticatedError) as stale:
        await _ask(fleet, node, key, "db", now=fleet.clock.now() - dt.timedelta(minutes=5))
    assert _reason(stale) == "expired"

    ephemeral = EphemeralKey()
    proof = key.secret_request("db", ephemeral, now=fleet.clock.now())
    request: dict[str, Any] = {
        "certificate_pem": node.certificate_pem,
        "name": "db",
        "ephemeral_public_jwk": ephemeral.public_jwk(),
        "signed_at_ms": proof.signed_at_ms,
        "nonce": proof.nonce,
        "signature": proof.signature,
    }
    await fleet.services.secret(**request)
    with pytest.raises(UnauthenticatedError) as replayed:
        await fleet.services.secret(**request)
    assert _reason(replayed) == "replayed"
    # A relay swapping in its own one-time key under the node's signature breaks the signature.
    with pytest.raises(UnauthenticatedError) as swapped:
        await fleet.services.secret(**{**request, "ephemeral_public_jwk": EphemeralKey().public_jwk()})
    assert _reason(swapped) == "bad_signature"
    with pytest.raises(InvalidInputError):
        await fleet.services.secret(**{**request, "nonce": b"short"})


async def test_a_revoked_or_retired_node_gets_no_secret(fleet: Fleet) -> None:
    token = await fleet.token(uses=2)
    revoked, revoked_key = await fleet.join(token.token, hardware=claims("SN-1"))
    retired, retired_key = await fleet.join(token.token, hardware=claims("SN-2"))
    await _secret(fleet, "db", f"pool:{fleet.pool}", "s3cr3t")
    await fleet.services.joins.ca.revoke_spiffe_id(revoked.spiffe_id, reason="decommissioned")
    with pytest.raises(UnauthenticatedError) as was_revoked:
        await _ask(fleet, revoked, revoked_key, "db")
    assert _reason(was_revoked) == "certificate_revoked"
    async with fleet.store.transaction() as tx:
        await tx.repository(NODES).retire(retired.node_id)
    with pytest.raises(AccessDeniedError) as was_retired:
        await _ask(fleet, retired, retired_key, "db")
    assert _reason(was_retired) == "node_retired"


async def test_refusals_are_audited_and_malformed_requests_are_invalid_input(fleet: Fleet) -> None:
    token = await fleet.token()
    node, key = await fleet.join(token.token)
    thief = NodeKey()
    with pytest.raises(UnauthenticatedError):
        await _ask(fleet, node, thief, "db")
    rows = await fleet.store.fetch(
        fleet.store.sql("SELECT action, outcome, actor, details FROM {s}.audit WHERE resource_type = 'secret'"), {}
    )
    assert [(r.action, r.outcome, r.actor, r.details["reason"]) for r in rows] == [
        ("compute:secrets:release", "denied", f"node:{node.node_id}", "bad_signature")
    ]
    ephemeral = EphemeralKey()
    proof = key.secret_request("db", ephemeral, now=fleet.clock.now())
    good: dict[str, Any] = {
        "certificate_pem": node.certificate_pem,
        "name": "db",
        "ephemeral_public_jwk": ephemeral.public_jwk(),
        "signed_at_ms": proof.signed_at_ms,
        "nonce": proof.nonce,
        "signature": proof.signature,
    }
    for change in ({"signed_at_ms": 2**63}, {"name": ""}, {"ephemeral_public_jwk": {"kty": "EC"}}, {"signature": b""}):
        with pytest.raises(InvalidInputError):
            await fleet.services.secret(**{**good, **change})
