"""Node identity without a database: configuration, the hardware key, challenges, signatures, and the daemon's
copy of the wire formats agreeing with the control plane's."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from bettercompute import JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute.errors import FailedPreconditionError, InvalidConfigError, InvalidInputError, UnauthenticatedError
from bettercompute.modules.nodes import HardwareClaims, NodesModule, hardware_key, renew_message, secret_message
from bettercompute.modules.nodes._proofs import ChallengeIssuer, join_binding, verify_signature
from bettercompute.modules.nodes._sealing import JoinKeyPair, Unsealer
from bettercompute.testing import InMemoryReplayGuard
from bettercompute_daemon.identity import EphemeralKey, NodeKey, seal_token
from bettercompute_daemon.identity import join_binding as daemon_binding

from ..core.conftest import make_compute, make_iam

JOIN = JoinSettings(gateway_address="gw.example.com:443", trust_domain="example.com")


def test_gateway_services_need_join_settings_and_a_kms(tmp_path: Path) -> None:
    with pytest.raises(FailedPreconditionError, match=r"Options\.join and Options\.kms"):
        _ = make_compute(kms=LocalKeyKms(tmp_path / "k")).gateway_services
    with pytest.raises(FailedPreconditionError, match=r"Options\.join and Options\.kms"):
        _ = make_compute(join=JOIN).gateway_services
    compute = make_compute(join=JOIN, kms=LocalKeyKms(tmp_path / "k"))
    with pytest.raises(FailedPreconditionError, match="after initialize"):
        _ = compute.gateway_services


def test_attestors_are_checked_and_need_join_service(tmp_path: Path) -> None:
    store = make_compute().context.store
    with pytest.raises(InvalidConfigError) as info:
        better_compute(Options(store=store, iam=make_iam(), attestors=[object()]))  # type: ignore[list-item]
    assert info.value.details["problems"] == [
        "attestors[0]: object is not an attestor (name and attest())",
        "attestors: JoinService runs only with Options.join and Options.kms",
    ]
    bad_age = JoinSettings(gateway_address="gw:1", trust_domain="example.com", sealed_token_max_age=dt.timedelta(0))
    with pytest.raises(InvalidConfigError) as age:
        better_compute(Options(store=store, iam=make_iam(), join=bad_age, kms=LocalKeyKms(tmp_path / "k")))
    assert age.value.details["problems"] == ["join.sealed_token_max_age: must be between 10 seconds and 1 hour"]
    for ttl in (dt.timedelta(minutes=1), dt.timedelta(hours=24, seconds=1)):
        bad_ttl = JoinSettings(gateway_address="gw:1", trust_domain="example.com", certificate_ttl=ttl)
        with pytest.raises(InvalidConfigError) as lifetime:
            better_compute(Options(store=store, iam=make_iam(), join=bad_ttl, kms=LocalKeyKms(tmp_path / "k")))
        assert lifetime.value.details["problems"] == [
            "join.certificate_ttl: must be more than 1 minute and at most 24 hours"
        ]
    with pytest.raises(InvalidConfigError) as twice:
        better_compute(Options(store=store, iam=make_iam(), modules=[NodesModule(JOIN, LocalKeyKms(tmp_path / "k"))]))
    assert twice.value.details["problems"] == ["modules[0]: the name 'nodes' is used twice"]


def test_the_hardware_key_follows_only_the_stable_claims() -> None:
    base = HardwareClaims(hostname="a", serial="SN-1", product="XE9680", gpu_model="H100", gpu_count=8)
    same = HardwareClaims(hostname="renamed", serial="sn-1", product="xe9680", gpu_count=7, gpu_uuids=("GPU-1",))
    assert hardware_key(base) == hardware_key(same)
    assert hardware_key(base).startswith("hk_") and len(hardware_key(base)) == 3 + 64
    assert hardware_key(base) != hardware_key(HardwareClaims(hostname="a", serial="SN-2", product="XE9680"))
    assert hardware_key(base) != hardware_key(
        HardwareClaims(hostname="a", serial="SN-1", product="XE9680", system_uuid="u-1")
    )


def test_a_challenge_opens_only_for_its_serial_and_issuer() -> None:
    issuer = ChallengeIssuer(b"k" * 32)
    challenge = issuer.issue("abc", now_ms=1_000)
    assert issuer.open(challenge, "abc")[0] == 1_000
    with pytest.raises(UnauthenticatedError, match="not issued"):
        issuer.open(challenge, "abd")
    with pytest.raises(UnauthenticatedError):
        ChallengeIssuer(b"x" * 32).open(challenge, "abc")
    tampered = challenge[:5] + bytes([challenge[5] ^ 1]) + challenge[6:]
    with pytest.raises(UnauthenticatedError):
        issuer.open(tampered, "abc")
    with pytest.raises(InvalidInputError):
        issuer.open(challenge[:-1], "abc")


@pytest.mark.parametrize("kind", ["ec", "ed25519", "rsa"])
def test_signatures_of_every_accepted_key_type_verify_and_others_do_not(kind: str) -> None:
    message = renew_message(b"c" * 60, b"csr")
    if kind == "ec":
        key = ec.generate_private_key(ec.SECP256R1())
        signature = key.sign(message, ec.ECDSA(hashes.SHA256()))
    elif kind == "ed25519":
        key = ed25519.Ed25519PrivateKey.generate()  # type: ignore[assignment]
        signature = key.sign(message)  # type: ignore[call-arg]
    else:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # type: ignore[assignment]
        signature = key.sign(message, padding.PKCS1v15(), hashes.SHA256())  # type: ignore[call-arg, arg-type]
    verify_signature(key.public_key(), signature, message)
    with pytest.raises(UnauthenticatedError):
        verify_signature(key.public_key(), signature, message + b"x")


@pytest.mark.anyio
async def test_the_daemon_seals_and_signs_what_the_control_plane_opens_and_checks() -> None:
    pair = JoinKeyPair.generate()
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    key = NodeKey()
    csr_pem = key.csr_pem()
    claims = {"hostname": "h", "serial": "SN-1", "gpu_uuids": ["GPU-1"]}
    binding = daemon_binding(csr_pem, claims, {"quote": "q"}, "pool_1")
    sealed = seal_token(pair.public_key_text(), "bcjt_jt_x.y", binding=binding, now=now)
    opened = await Unsealer(pair, InMemoryReplayGuard()).unseal(sealed, now=now, max_age=dt.timedelta(minutes=5))
    assert opened.plaintext == binding + b"bcjt_jt_x.y" and opened.sealed_at == now
    csr_der = x509.load_pem_x509_csr(csr_pem.encode()).public_bytes(serialization.Encoding.DER)
    assert join_binding(csr_der, claims, {"quote": "q"}, "pool_1") == binding
    assert join_binding(csr_der, claims, None, "pool_1") != binding

    challenge = ChallengeIssuer(b"k" * 32).issue("1f", now_ms=5)
    renewal = key.renewal_proof(challenge, csr_pem)
    verify_signature(key.private_key.public_key(), renewal, renew_message(challenge, csr_der))

    ephemeral = EphemeralKey()
    proof = key.secret_request("db", ephemeral, now=now)
    message = secret_message(proof.signed_at_ms, proof.nonce, "db", ephemeral.thumbprint())
    verify_signature(key.private_key.public_key(), proof.signature, message)
    assert "d" not in ephemeral.public_jwk() and "<private>" in repr(key) and "<private>" in repr(ephemeral)
