"""After joins, renewals and secret releases, neither the database nor any log line holds a token secret, a private
key (node, CA, JoinService, one-time JWE key) or a secret's plaintext."""

from __future__ import annotations

import logging

import pytest
from cryptography.hazmat.primitives import serialization

from bettercompute.modules.nodes import JOIN_KEYS, CertificateAuthority, JoinExpect
from bettercompute.modules.nodes._join_keys import join_key_context
from bettercompute.modules.secrets import CreateSecretInput
from bettercompute_daemon.identity import EphemeralKey, NodeKey

from ..dump import dump_schema
from .conftest import Fleet, claims

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

PLAINTEXT = "plaintext-of-the-bmc-password-41c9"


async def test_the_database_and_the_logs_hold_no_secret_after_a_run(
    fleet: Fleet, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    created = await fleet.token(uses=2, reclaim="same-hardware", expect=JoinExpect(serial="SN-1"))
    token_secret = created.token.partition(".")[2]
    node, key = await fleet.join(created.token, hardware=claims("SN-1"))
    again, key = await fleet.join(created.token, hardware=claims("SN-1"))  # a reclaim: revocation and a new key
    challenge = await fleet.services.renew_challenge(certificate_pem=again.certificate_pem)
    new_key = NodeKey()
    csr = new_key.csr_pem()
    renewed = await fleet.renew(again.certificate_pem, key, challenge, csr)
    await fleet.compute.api.secrets.create(
        fleet.alice, CreateSecretInput(tenant=fleet.acme, name="bmc", scope=f"node:{node.node_id}", value=PLAINTEXT)
    )
    ephemeral = EphemeralKey()
    proof = new_key.secret_request("bmc", ephemeral, now=fleet.clock.now())
    answer = await fleet.services.secret(
        certificate_pem=renewed.certificate_pem,
        name="bmc",
        ephemeral_public_jwk=ephemeral.public_jwk(),
        signed_at_ms=proof.signed_at_ms,
        nonce=proof.nonce,
        signature=proof.signature,
    )
    assert ephemeral.open(answer) == PLAINTEXT.encode()

    forbidden: dict[str, list[str]] = {
        "token": [created.token, token_secret],
        "plaintext": [PLAINTEXT, PLAINTEXT.encode().hex()],
        "ephemeral key": [str(ephemeral._key.as_dict(private=True)["d"])],
    }
    for label, node_key in (("node key", key), ("new node key", new_key)):
        value = node_key.private_key.private_numbers().private_value
        der = node_key.private_key.private_bytes(
            serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        forbidden[label] = [format(value, "x"), der.hex(), node_key.private_key_pem().decode().splitlines()[1]]
    ca: CertificateAuthority = fleet.services.joins.ca
    for active in [k for k in await ca.keys() if k.state == "active"]:  # the root and the intermediate
        ca_der = await fleet.kms.decrypt(active.sealed_key, context=f"ca:{ca.trust_domain}:{active.id}")
        forbidden[f"CA key {active.id}"] = [ca_der.hex(), ca_der[-32:].hex()]
    join_record = await fleet.store.repository(JOIN_KEYS).active()
    assert join_record is not None
    join_private = await fleet.kms.decrypt(join_record.sealed_key, context=join_key_context(join_record.id))
    forbidden["join key"] = [join_private.hex()]

    dump = dump_schema(database_url, fleet.store.schema)
    logged = "\n".join(f"{r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in caplog.records)
    assert caplog.records  # the joins, the renewal and the release were logged
    for label, needles in forbidden.items():
        for needle in needles:
            assert needle not in dump, f"the database holds a {label}"
            assert needle not in logged, f"a log line holds a {label}"
    # What the database does hold: the hash of the token's secret, and the keys only sealed.
    assert created.id in dump and "adopting" in dump
