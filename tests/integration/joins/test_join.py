"""JoinService against PostgreSQL: a daemon's join end to end, every refusal with its code, races and reclaim."""

from __future__ import annotations

import datetime as dt
from typing import Any

import anyio
import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from bettercompute.errors import (
    AccessDeniedError,
    ComputeError,
    ConflictError,
    FailedPreconditionError,
    InvalidInputError,
    UnauthenticatedError,
)
from bettercompute.modules.nodes import (
    JOIN_TOKENS,
    NODES,
    GetJoinTokenInput,
    JoinExpect,
    RevokeJoinTokenInput,
    hash_secret,
    parse_token,
)
from bettercompute_daemon.identity import NodeKey, join_binding, seal_token

from .conftest import TRUST_DOMAIN, Fleet, claims

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def _reason(exc: pytest.ExceptionInfo[ComputeError]) -> Any:
    return exc.value.details.get("reason")


async def _uses_left(fleet: Fleet, token_id: str) -> int:
    token = await fleet.compute.api.join_tokens.get(fleet.alice, GetJoinTokenInput(id=token_id))
    return int(token.uses_left)


async def test_a_join_makes_an_adopting_node_with_a_24_hour_spiffe_certificate(fleet: Fleet) -> None:
    created = await fleet.token(uses=2)
    assert f"--join-key={await fleet.join_key()}" in created.join_command
    assert f"--pool {fleet.pool}" in created.join_command and "--ca-bundle " in created.join_command

    result, _ = await fleet.join(created.token, pool_id=fleet.pool)

    node = await fleet.store.repository(NODES).get(result.node_id)
    assert node is not None and node.state == "adopting" and node.pool_id == fleet.pool and node.tenant == fleet.acme
    assert node.claims["serial"] == "SN-0001" and node.enrollments == 1 and not result.reclaimed
    assert result.spiffe_id == f"spiffe://{TRUST_DOMAIN}/node/{result.node_id}"
    cert = x509.load_pem_x509_certificate(result.certificate_pem.encode())
    bundle = x509.load_pem_x509_certificates(result.trust_bundle_pem.encode())
    verifier = PolicyBuilder().store(Store(bundle)).time(fleet.clock.now()).build_client_verifier()
    chain = x509.load_pem_x509_certificates(result.chain_pem.encode())
    assert list(verifier.verify(cert, chain).subjects or []) == [x509.UniformResourceIdentifier(result.spiffe_id)]
    with pytest.raises(VerificationError):  # the leaf alone does not verify: the root signs only intermediates
        verifier.verify(cert, [])
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == dt.timedelta(hours=24)
    assert await _uses_left(fleet, created.id) == 1
    events = await fleet.events("node.joined")
    assert [(key, payload["pool_id"]) for key, payload in events] == [(result.node_id, fleet.pool)]


async def test_no_step_of_a_join_asks_iam(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    created = await fleet.token()
    iam = fleet.compute.context.iam
    calls: list[str] = []
    for name in ("authenticate", "require", "decide", "check"):
        if hasattr(iam, name):

            async def record(*args: Any, _name: str = name, **kwargs: Any) -> Any:
                calls.append(_name)
                raise AssertionError(f"JoinService called IAM's {_name}")

            monkeypatch.setattr(iam, name, record)
    result, _ = await fleet.join(created.token)
    assert calls == [] and result.node_id


async def test_malformed_unknown_expired_revoked_exhausted_and_other_pool_tokens_are_refused(fleet: Fleet) -> None:
    with pytest.raises(InvalidInputError) as bad:
        await fleet.join("not-a-token")
    assert _reason(bad) == "malformed_token"

    good = await fleet.token()
    token_id, _, _ = good.token.removeprefix("bcjt_").partition(".")
    with pytest.raises(UnauthenticatedError) as unknown:
        await fleet.join(f"bcjt_{token_id}.{'A' * 43}")
    assert _reason(unknown) == "unknown_token"

    short = await fleet.token(expires_in_seconds=60)
    fleet.clock.advance(dt.timedelta(seconds=61))
    with pytest.raises(UnauthenticatedError) as expired:
        await fleet.join(short.token)
    assert _reason(expired) == "token_expired"

    revoked = await fleet.token()
    await fleet.compute.api.join_tokens.revoke(fleet.alice, RevokeJoinTokenInput(id=revoked.id))
    with pytest.raises(UnauthenticatedError) as was_revoked:
        await fleet.join(revoked.token)
    assert _reason(was_revoked) == "token_revoked"

    once = await fleet.token(uses=1)
    await fleet.join(once.token, hardware=claims("SN-A"))
    with pytest.raises(UnauthenticatedError) as exhausted:
        await fleet.join(once.token, hardware=claims("SN-B"))
    assert _reason(exhausted) == "token_exhausted"

    other_pool = await fleet.new_pool("other")
    with pytest.raises(AccessDeniedError) as wrong_pool:
        await fleet.join(good.token, pool_id=other_pool)
    assert _reason(wrong_pool) == "wrong_pool"
    assert await _uses_left(fleet, good.id) == 1  # none of the refusals spent a use
    assert len(await fleet.store.repository(NODES).for_pool(fleet.pool)) == 1


async def test_a_payload_sealed_to_another_key_or_replayed_is_refused(fleet: Fleet) -> None:
    from bettercompute.modules.nodes._sealing import JoinKeyPair

    created = await fleet.token(uses=3)
    stranger = JoinKeyPair.generate().public_key_text()
    key = NodeKey()
    csr = key.csr_pem()
    binding = join_binding(csr, claims(), None, None)
    with pytest.raises(UnauthenticatedError) as wrong_key:
        await fleet.services.join(
            sealed_token=seal_token(stranger, created.token, binding=binding, now=fleet.clock.now()),
            csr_pem=csr,
            claims=claims(),
        )
    assert _reason(wrong_key) == "unopenable"

    sealed = await fleet.seal(created.token, csr_pem=csr, hardware=claims())
    await fleet.services.join(sealed_token=sealed, csr_pem=csr, claims=claims())
    with pytest.raises(UnauthenticatedError) as replayed:
        await fleet.services.join(sealed_token=sealed, csr_pem=csr, claims=claims())
    assert _reason(replayed) == "replayed"
    assert await _uses_left(fleet, created.id) == 2


async def test_a_relay_cannot_pair_a_sealed_token_with_its_own_csr_claims_or_pool(fleet: Fleet) -> None:
    created = await fleet.token(uses=3)
    other_pool = await fleet.new_pool("other")
    key = NodeKey()
    csr = key.csr_pem()
    relay_key = NodeKey()
    for change in (
        {"csr_pem": relay_key.csr_pem()},
        {"claims": claims("SN-STOLEN")},
        {"claims": {**claims(), "gpu_count": 8}},
        {"evidence": {"quote": "x"}},
        {"pool_id": other_pool},
    ):
        # Each time the daemon's genuine sealed token, for its own request, is sent with one thing changed.
        sealed = await fleet.seal(created.token, csr_pem=csr, hardware=claims())
        request: dict[str, Any] = {"sealed_token": sealed, "csr_pem": csr, "claims": claims(), **change}
        with pytest.raises(UnauthenticatedError) as mismatch:
            await fleet.services.join(**request)
        assert _reason(mismatch) == "binding_mismatch", change
    assert await _uses_left(fleet, created.id) == 3
    assert await fleet.store.repository(NODES).for_pool(fleet.pool) == []


async def test_a_csr_with_a_foreign_signature_or_its_own_san_is_refused(fleet: Fleet) -> None:
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.x509.oid import NameOID

    created = await fleet.token()
    # A CSR carrying one Ed25519 key but signed by another (Ed25519 signatures are always 64 bytes: splice them).
    mine, other = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "n")])
    good = x509.CertificateSigningRequestBuilder().subject_name(name).sign(mine, None)
    forged = x509.CertificateSigningRequestBuilder().subject_name(name).sign(other, None)
    spliced = good.public_bytes(serialization.Encoding.DER).replace(good.signature, forged.signature)
    pem = x509.load_der_x509_csr(spliced).public_bytes(serialization.Encoding.PEM).decode()
    with pytest.raises(InvalidInputError) as mismatch:
        await fleet.services.join(sealed_token=await fleet.seal(created.token), csr_pem=pem, claims=claims())
    assert _reason(mismatch) == "signature"

    ec_key = ec.generate_private_key(ec.SECP256R1())
    with_san = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(name)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"spiffe://{TRUST_DOMAIN}/site/admin")]),
            critical=False,
        )
        .sign(ec_key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
        .decode()
    )
    with pytest.raises(InvalidInputError) as san:
        await fleet.services.join(sealed_token=await fleet.seal(created.token), csr_pem=with_san, claims=claims())
    assert _reason(san) == "san"
    assert await _uses_left(fleet, created.id) == 1


async def test_claims_that_violate_expect_are_refused_and_spend_nothing(fleet: Fleet) -> None:
    created = await fleet.token(expect=JoinExpect(serial="SN-0001", gpu_model="H100", gpu_count=8))
    with pytest.raises(AccessDeniedError) as refused:
        await fleet.join(created.token, hardware=claims("SN-0001", gpu_model="H100", gpu_count=4))
    assert _reason(refused) == "expect_mismatch" and refused.value.details["fields"] == ["gpu_count"]
    with pytest.raises(AccessDeniedError) as missing:
        await fleet.join(created.token, hardware=claims("SN-0001"))
    assert missing.value.details["fields"] == ["gpu_model", "gpu_count"]
    assert await _uses_left(fleet, created.id) == 1
    assert await fleet.store.repository(NODES).for_pool(fleet.pool) == []
    result, _ = await fleet.join(created.token, hardware=claims("SN-0001", gpu_model="H100", gpu_count=8))
    assert result.node_id


_EXPECTED: dict[str, Any] = {"serial": "SN-0042", "product": "PowerEdge XE9680", "gpu_model": "H100", "gpu_count": 8}
_OTHER: dict[str, Any] = {"serial": "SN-0043", "product": "PowerEdge R760", "gpu_model": "A100", "gpu_count": 7}


@pytest.mark.parametrize("field", sorted(_EXPECTED))
async def test_each_expected_claim_is_compared_on_its_own(fleet: Fleet, field: str) -> None:
    # Every other claim matches, so only this field's comparison can refuse the join.
    created = await fleet.token(expect=JoinExpect(**_EXPECTED))
    differing = {**_EXPECTED, field: _OTHER[field]}
    with pytest.raises(AccessDeniedError) as refused:
        await fleet.join(created.token, hardware=claims(**differing))
    assert _reason(refused) == "expect_mismatch" and refused.value.details["fields"] == [field]
    absent = {name: value for name, value in _EXPECTED.items() if name != field}
    with pytest.raises(AccessDeniedError) as missing:
        await fleet.join(created.token, hardware=claims(**absent) if field != "product" else _without_product(absent))
    assert missing.value.details["fields"] == [field]
    assert await _uses_left(fleet, created.id) == 1
    assert await fleet.store.repository(NODES).for_pool(fleet.pool) == []
    result, _ = await fleet.join(created.token, hardware=claims(**_EXPECTED))
    assert result.node_id


def _without_product(fields: dict[str, Any]) -> dict[str, Any]:
    # ``claims()`` fills in a product; a machine that reports none must not match an expected one.
    sent = claims(**fields)
    del sent["product"]
    return sent


async def test_bad_claims_and_a_provider_pool_are_refused(fleet: Fleet) -> None:
    created = await fleet.token(uses=5)
    with pytest.raises(InvalidInputError) as no_serial:
        await fleet.join(created.token, hardware={"hostname": "h1"})
    assert no_serial.value.details["path"] == "claims.serial"
    with pytest.raises(InvalidInputError) as unknown_field:
        await fleet.join(created.token, hardware={**claims(), "root": True})
    assert unknown_field.value.details["path"] == "claims.root"
    provider = await fleet.new_pool("cloud", pool_class="provider")
    token = await fleet.token(pool=provider)
    with pytest.raises(FailedPreconditionError):
        await fleet.join(token.token)
    assert await _uses_left(fleet, created.id) == 5


async def test_two_joins_racing_for_the_last_use_exactly_one_wins(fleet: Fleet) -> None:
    created = await fleet.token(uses=1)
    outcomes: list[str] = []

    async def attempt(serial: str) -> None:
        try:
            await fleet.join(created.token, hardware=claims(serial))
            outcomes.append("joined")
        except UnauthenticatedError as exc:
            outcomes.append(str(exc.details.get("reason")))

    async with anyio.create_task_group() as tg:
        for serial in ("SN-R1", "SN-R2", "SN-R3", "SN-R4"):
            tg.start_soon(attempt, serial)
    assert sorted(outcomes) == ["joined", "token_exhausted", "token_exhausted", "token_exhausted"]
    assert len(await fleet.store.repository(NODES).for_pool(fleet.pool)) == 1


async def test_the_spend_itself_refuses_a_token_that_expired_after_the_checks_before_it(fleet: Fleet) -> None:
    """A join checks the token before it spends a use; the spend's own statement must still refuse a token that
    expired in between (the checks before it see an earlier time), and spend nothing."""
    created = await fleet.token(uses=2, expires_in_seconds=600)
    parsed = parse_token(created.token)
    assert parsed is not None
    token_id, secret = parsed
    tokens = fleet.store.repository(JOIN_TOKENS)
    stored = await tokens.get(token_id)
    assert stored is not None
    async with fleet.store.transaction() as tx:
        spent = await tx.repository(JOIN_TOKENS).consume(
            id=token_id, secret_hash=hash_secret(secret), now=stored.expires_at + dt.timedelta(milliseconds=1)
        )
    assert spent.outcome == "expired"
    after = await tokens.get(token_id)
    assert after is not None and after.uses_left == 2 and after.last_used_at is None


async def test_same_hardware_reclaims_its_node_id_and_revokes_the_old_certificates(fleet: Fleet) -> None:
    first_token = await fleet.token(reclaim="same-hardware")
    first, _ = await fleet.join(first_token.token, hardware=claims("SN-77"))
    # Re-imaged: a new key and host name, the same serial and product; the operator's token names the serial.
    created = await fleet.token(reclaim="same-hardware", expect=JoinExpect(serial="SN-77"))
    second, _ = await fleet.join(created.token, hardware=claims("SN-77", hostname="reimaged"))
    assert second.node_id == first.node_id and second.reclaimed
    assert await fleet.services.is_revoked(first.serial) and not await fleet.services.is_revoked(second.serial)
    node = await fleet.store.repository(NODES).get(first.node_id)
    assert node is not None and node.enrollments == 2 and node.claims["hostname"] == "reimaged"
    revoked = await fleet.events("certificate.revoked")
    assert [key for key, _ in revoked] == [first.spiffe_id]


async def test_claims_alone_cannot_take_over_a_node_that_holds_a_valid_certificate(fleet: Fleet) -> None:
    victim_token = await fleet.token()
    victim, _ = await fleet.join(victim_token.token, hardware=claims("SN-VICTIM"))
    # Someone with a reclaiming token for the pool who knows (or guesses) the victim's serial and product.
    created = await fleet.token(reclaim="same-hardware")
    with pytest.raises(ConflictError) as live:
        await fleet.join(created.token, hardware=claims("SN-VICTIM"))
    assert live.value.details == {"reason": "node_live"}
    assert not await fleet.services.is_revoked(victim.serial)
    assert await _uses_left(fleet, created.id) == 1
    node = await fleet.store.repository(NODES).get(victim.node_id)
    assert node is not None and node.enrollments == 1
    # Once the operator revokes the victim's certificate (a decommissioned disk, say), the same token may reclaim.
    await fleet.services.joins.ca.revoke_spiffe_id(victim.spiffe_id, reason="re-imaging")
    again, _ = await fleet.join(created.token, hardware=claims("SN-VICTIM"))
    assert again.node_id == victim.node_id and again.reclaimed


async def test_without_reclaim_the_same_hardware_is_a_conflict_and_spends_nothing(fleet: Fleet) -> None:
    first_token = await fleet.token()
    first, _ = await fleet.join(first_token.token, hardware=claims("SN-9"))
    again = await fleet.token()
    with pytest.raises(ConflictError) as conflict:
        await fleet.join(again.token, hardware=claims("SN-9"))
    assert conflict.value.details == {"reason": "hardware_taken"}  # which node it is stays the operator's to see
    assert await _uses_left(fleet, again.id) == 1
    assert not await fleet.services.is_revoked(first.serial)


async def test_two_first_joins_of_one_machine_make_one_node(fleet: Fleet) -> None:
    tokens = [await fleet.token() for _ in range(3)]
    outcomes: list[str] = []

    async def attempt(token: str) -> None:
        try:
            await fleet.join(token, hardware=claims("SN-TWIN"))
            outcomes.append("joined")
        except ConflictError:
            outcomes.append("conflict")

    async with anyio.create_task_group() as tg:
        for created in tokens:
            tg.start_soon(attempt, created.token)
    assert sorted(outcomes) == ["conflict", "conflict", "joined"]
    assert len(await fleet.store.repository(NODES).for_pool(fleet.pool)) == 1
    assert sorted([await _uses_left(fleet, t.id) for t in tokens]) == [0, 1, 1]  # the losers spent nothing


async def test_an_unknown_token_id_and_a_wrong_secret_look_the_same(fleet: Fleet) -> None:
    created = await fleet.token()
    token_id = created.id
    errors = []
    for token in (f"bcjt_{token_id}.{'A' * 43}", f"bcjt_jt_{'0' * 20}.{'A' * 43}"):
        with pytest.raises(UnauthenticatedError) as refused:
            await fleet.join(token)
        errors.append((str(refused.value), refused.value.details))
    assert errors[0] == errors[1] == ("the join token is not valid", {"reason": "unknown_token"})


async def test_expect_compares_text_claims_without_regard_to_case(fleet: Fleet) -> None:
    created = await fleet.token(expect=JoinExpect(serial="sn-abc", gpu_model="NVIDIA H100 80GB HBM3"))
    result, _ = await fleet.join(created.token, hardware=claims("SN-ABC", gpu_model="nvidia h100 80gb hbm3"))
    assert result.node_id


async def test_malformed_request_fields_are_invalid_input(fleet: Fleet) -> None:
    created = await fleet.token()
    sealed = await fleet.seal(created.token)
    for request in (
        {"sealed_token": "text", "csr_pem": NodeKey().csr_pem(), "claims": claims()},
        {"sealed_token": sealed, "csr_pem": None, "claims": claims()},
        {"sealed_token": sealed, "csr_pem": NodeKey().csr_pem(), "claims": claims(), "pool_id": "../etc"},
        {"sealed_token": sealed, "csr_pem": NodeKey().csr_pem(), "claims": {"hostname": float("nan")}},
    ):
        with pytest.raises(InvalidInputError):
            await fleet.services.join(**request)
    assert await _uses_left(fleet, created.id) == 1
