"""Renewal with proof of possession, and the refusals: no proof, someone else's CSR, a revoked certificate, a retired
node, a used or foreign challenge, an expired certificate (which re-enrolls through reclaim instead)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from cryptography import x509

from bettercompute.errors import AccessDeniedError, ComputeError, InvalidInputError, UnauthenticatedError
from bettercompute.modules.nodes import CERTIFICATES, NODES, JoinResult
from bettercompute_daemon.identity import NodeKey

from .conftest import Fleet, claims

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


def _reason(exc: pytest.ExceptionInfo[ComputeError]) -> Any:
    return exc.value.details.get("reason")


async def _joined(fleet: Fleet, serial: str = "SN-1", *, reclaim: str = "none") -> tuple[JoinResult, NodeKey]:
    created = await fleet.token(reclaim=reclaim)
    return await fleet.join(created.token, hardware=claims(serial))


async def test_a_node_renews_with_a_signature_over_the_challenge_and_its_new_csr(fleet: Fleet) -> None:
    joined, key = await _joined(fleet)
    fleet.clock.advance(dt.timedelta(hours=20))
    challenge = await fleet.services.renew_challenge(certificate_pem=joined.certificate_pem)
    new_key = NodeKey()
    csr = new_key.csr_pem()
    renewed = await fleet.renew(joined.certificate_pem, key, challenge, csr)
    assert renewed.node_id == joined.node_id and renewed.spiffe_id == joined.spiffe_id
    assert renewed.serial != joined.serial and renewed.not_after > joined.not_after
    cert = x509.load_pem_x509_certificate(renewed.certificate_pem.encode())
    assert cert.public_key() == new_key.private_key.public_key()
    # The old certificate is not revoked: it keeps the live session up until it expires.
    assert not await fleet.services.is_revoked(joined.serial)


async def test_a_renewal_without_proof_of_possession_is_refused(fleet: Fleet) -> None:
    joined, key = await _joined(fleet)
    thief = NodeKey()  # holds the certificate (it is public), not the key
    challenge = await fleet.services.renew_challenge(certificate_pem=joined.certificate_pem)
    csr = thief.csr_pem()
    with pytest.raises(UnauthenticatedError) as no_proof:
        await fleet.renew(joined.certificate_pem, thief, challenge, csr)
    assert _reason(no_proof) == "bad_signature"
    # A relay swapping in its own CSR under the node's genuine signature is refused too.
    genuine = key.renewal_proof(challenge, key.csr_pem())
    with pytest.raises(UnauthenticatedError) as swapped:
        await fleet.services.renew(
            certificate_pem=joined.certificate_pem, challenge=challenge, signature=genuine, csr_pem=csr
        )
    assert _reason(swapped) == "bad_signature"
    with pytest.raises(InvalidInputError):
        await fleet.services.renew(
            certificate_pem=joined.certificate_pem, challenge=challenge, signature=b"", csr_pem=csr
        )


async def test_a_challenge_is_used_once_and_only_for_its_certificate(fleet: Fleet) -> None:
    joined, key = await _joined(fleet, "SN-1")
    other, other_key = await _joined(fleet, "SN-2")
    challenge = await fleet.services.renew_challenge(certificate_pem=joined.certificate_pem)
    csr = key.csr_pem()
    proof = key.renewal_proof(challenge, csr)
    await fleet.services.renew(
        certificate_pem=joined.certificate_pem, challenge=challenge, signature=proof, csr_pem=csr
    )
    with pytest.raises(UnauthenticatedError) as replayed:
        await fleet.services.renew(
            certificate_pem=joined.certificate_pem, challenge=challenge, signature=proof, csr_pem=csr
        )
    assert _reason(replayed) == "replayed"
    other_csr = other_key.csr_pem()
    with pytest.raises(UnauthenticatedError) as foreign:
        await fleet.renew(other.certificate_pem, other_key, challenge, other_csr)
    assert _reason(foreign) == "bad_challenge"
    stale = await fleet.services.renew_challenge(certificate_pem=other.certificate_pem)
    fleet.clock.advance(dt.timedelta(minutes=3))
    with pytest.raises(UnauthenticatedError) as too_old:
        await fleet.renew(other.certificate_pem, other_key, stale, other_csr)
    assert _reason(too_old) == "challenge_expired"


async def test_a_revoked_certificate_or_a_retired_node_cannot_renew(fleet: Fleet) -> None:
    revoked, _ = await _joined(fleet, "SN-1")
    await fleet.services.joins.ca.revoke(revoked.serial, reason="stolen")
    with pytest.raises(UnauthenticatedError) as was_revoked:
        await fleet.services.renew_challenge(certificate_pem=revoked.certificate_pem)
    assert _reason(was_revoked) == "certificate_revoked"

    retired, key = await _joined(fleet, "SN-2")
    challenge = await fleet.services.renew_challenge(certificate_pem=retired.certificate_pem)
    async with fleet.store.transaction() as tx:
        await tx.repository(NODES).retire(retired.node_id)
    csr = key.csr_pem()
    with pytest.raises(AccessDeniedError) as was_retired:
        await fleet.renew(retired.certificate_pem, key, challenge, csr)
    assert _reason(was_retired) == "node_retired"


async def test_a_certificate_from_another_ca_is_untrusted(fleet: Fleet, database_url: str) -> None:
    from bettercompute.modules.nodes import CertificateAuthority
    from bettercompute_store_pg import PgStore

    joined, _ = await _joined(fleet)
    # Same trust domain, another CA (another schema's keys): the chain does not verify here.
    other_store = PgStore(database_url, schema=fleet.store.schema + "_x")
    await other_store.open()
    try:
        await other_store.install()
        for module in ("pools", "nodes"):  # the CA's tables, and the pools its nodes refer to
            await other_store.migrate(module, other_store.migrations(module))
        stranger = CertificateAuthority(other_store, fleet.kms, trust_domain=fleet.services.joins.ca.trust_domain)
        forged = await stranger.issue(NodeKey().csr_pem(), node_id=joined.node_id)
    finally:
        async with other_store.connection() as conn:
            await conn.execute(f'DROP SCHEMA "{other_store.schema}" CASCADE')
        await other_store.close()
    with pytest.raises(UnauthenticatedError) as untrusted:
        await fleet.services.renew_challenge(certificate_pem=forged.certificate_pem)
    assert _reason(untrusted) == "untrusted"
    with pytest.raises(InvalidInputError):
        await fleet.services.renew_challenge(certificate_pem="not a certificate")


async def test_an_expired_certificate_re_enrolls_through_reclaim_not_renewal(fleet: Fleet) -> None:
    joined, _ = await _joined(fleet, "SN-5", reclaim="same-hardware")
    fleet.clock.advance(dt.timedelta(hours=25))  # offline past its certificate's lifetime
    with pytest.raises(UnauthenticatedError) as expired:
        await fleet.services.renew_challenge(certificate_pem=joined.certificate_pem)
    assert _reason(expired) == "certificate_expired"
    # The documented path: join again with a reclaiming token; the same hardware gets its node id back.
    token = await fleet.token(reclaim="same-hardware")
    again, _ = await fleet.join(token.token, hardware=claims("SN-5"))
    assert again.node_id == joined.node_id and again.reclaimed


async def test_only_the_newest_certificate_renews_but_a_lost_answer_can_be_asked_again(fleet: Fleet) -> None:
    joined, old_key = await _joined(fleet)
    new_key = NodeKey()
    new_csr = new_key.csr_pem()
    challenge = await fleet.services.renew_challenge(certificate_pem=joined.certificate_pem)
    await fleet.renew(joined.certificate_pem, old_key, challenge, new_csr)
    # The answer was lost: the node asks again with its old certificate for the same new key, and gets it.
    again = await fleet.services.renew_challenge(certificate_pem=joined.certificate_pem)
    retried = await fleet.renew(joined.certificate_pem, old_key, again, new_csr)
    assert (
        x509.load_pem_x509_certificate(retried.certificate_pem.encode()).public_key()
        == new_key.private_key.public_key()
    )
    # Whoever stole the old key cannot renew it into a key of their own: the node moved on.
    thief_csr = NodeKey().csr_pem()
    third = await fleet.services.renew_challenge(certificate_pem=joined.certificate_pem)
    with pytest.raises(UnauthenticatedError) as superseded:
        await fleet.renew(joined.certificate_pem, old_key, third, thief_csr)
    assert _reason(superseded) == "superseded"


async def test_a_renewal_racing_a_revocation_never_outlives_it(fleet: Fleet) -> None:
    import anyio

    joined, key = await _joined(fleet)
    challenge = await fleet.services.renew_challenge(certificate_pem=joined.certificate_pem)
    csr = key.csr_pem()
    outcome: list[str] = []

    async def renew() -> None:
        try:
            await fleet.renew(joined.certificate_pem, key, challenge, csr)
            outcome.append("renewed")
        except UnauthenticatedError as exc:
            outcome.append(str(exc.details.get("reason")))

    # The revocation's transaction is open (holding the identity lock) while the renewal runs; it commits later.
    async with anyio.create_task_group() as tg, fleet.store.transaction() as tx:
        await fleet.services.joins.ca.revoke_spiffe_id_in(tx, joined.spiffe_id, reason="compromised")
        tg.start_soon(renew)
        await anyio.sleep(0.5)
        assert outcome == []  # the renewal waits for the revocation
    assert outcome == ["certificate_revoked"]
    assert all(
        c.serial == joined.serial for c in await fleet.store.repository(CERTIFICATES).revocations(joined.spiffe_id)
    )


async def test_retiring_a_node_revokes_its_certificates(fleet: Fleet) -> None:
    joined, _ = await _joined(fleet)
    node = await fleet.services.joins.retire(joined.node_id, reason="decommissioned")
    assert node.state == "retired" and node.retired_at is not None
    assert await fleet.services.is_revoked(joined.serial)
    assert [k for k, _ in await fleet.events("certificate.revoked")] == [joined.spiffe_id]
    with pytest.raises(UnauthenticatedError):
        await fleet.services.renew_challenge(certificate_pem=joined.certificate_pem)
    # Its hardware may join again, as a new node.
    token = await fleet.token()
    again, _ = await fleet.join(token.token, hardware=claims("SN-1"))
    assert again.node_id != joined.node_id and not again.reclaimed
