"""The daemon's check of the instructions it is sent (``InstructionCheck``): only a desired state or a command the
control plane's instruction key signed for this node, under a signer certificate of the CA it pinned, passes."""

from __future__ import annotations

import datetime as dt
import time

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import given
from hypothesis import strategies as st

import bettercompute_proto as wire
from bettercompute_daemon._instructions import InstructionCheck

from ._signer import TestSigner

NODE = "node_0123456789abcdef"
SIGNER = TestSigner("example.com")
CONTENT = '{"allocations":[{"id":"res_1","gpus":["GPU-1"]}]}'


def _check(signer: TestSigner = SIGNER, *, clock: float | None = None) -> InstructionCheck:
    pem = signer.ca.public_bytes(serialization.Encoding.PEM)
    return InstructionCheck(
        lambda: pem, trust_domain="example.com", clock=(lambda: clock) if clock is not None else time.time
    )


def test_a_desired_state_signed_for_this_node_passes() -> None:
    assert _check().desired_state(NODE, SIGNER.desired(NODE, 7, CONTENT)) is None


def test_an_unsigned_altered_misdirected_or_foreign_desired_state_is_refused() -> None:
    check = _check()
    genuine = SIGNER.desired(NODE, 7, CONTENT)
    assert check.desired_state(NODE, wire.DesiredState(generation=7, content_json=CONTENT)) == "unsigned"
    unsigned_certificate = wire.DesiredState(generation=7, content_json=CONTENT, signature=genuine.signature)
    assert check.desired_state(NODE, unsigned_certificate) == "unsigned"
    altered = wire.DesiredState(
        generation=7,
        content_json=CONTENT.replace("GPU-1", "GPU-2"),
        signature=genuine.signature,
        signer_certificate=genuine.signer_certificate,
    )
    assert check.desired_state(NODE, altered) == "bad_signature"
    later = wire.DesiredState(
        generation=8, content_json=CONTENT, signature=genuine.signature, signer_certificate=genuine.signer_certificate
    )
    assert check.desired_state(NODE, later) == "bad_signature"
    assert check.desired_state("node_another", genuine) == "bad_signature"
    other_key = ec.generate_private_key(ec.SECP256R1())
    message = wire.desired_state_message(node_id=NODE, generation=7, content_json=CONTENT)
    forged = wire.DesiredState(
        generation=7,
        content_json=CONTENT,
        signature=other_key.sign(message, ec.ECDSA(hashes.SHA256())),
        signer_certificate=genuine.signer_certificate,
    )
    assert check.desired_state(NODE, forged) == "bad_signature"


def test_a_signer_certificate_is_refused_unless_it_is_exactly_what_the_control_plane_issues() -> None:
    signer = TestSigner("example.com")
    check = _check(signer)
    stranger = TestSigner("example.com")  # a CA the node never pinned
    cases = {
        "another trust domain": signer.certify(uri="spiffe://evil.example/signer/sgk_test"),
        "not a signer": signer.certify(uri="spiffe://example.com/node/sgk_test"),
        "no key id": signer.certify(uri="spiffe://example.com/signer/"),
        "a TLS server's use": signer.certify(usage=ExtendedKeyUsageOID.SERVER_AUTH),
        "a TLS client's use": signer.certify(usage=ExtendedKeyUsageOID.CLIENT_AUTH),
        "a CA": signer.certify(ca=True),
        "expired": signer.certify(lifetime=(dt.timedelta(hours=-2), dt.timedelta(hours=-1))),
        "not yet valid": signer.certify(lifetime=(dt.timedelta(hours=1), dt.timedelta(hours=2))),
        "another CA's": signer.certify(issuer_key=stranger.ca_key),
        "not a certificate": b"\x30\x03\x02\x01\x00",
        "too large": b"\x30" * 9000,
    }
    message = wire.desired_state_message(node_id=NODE, generation=1, content_json=CONTENT)
    for case, certificate in cases.items():
        desired = wire.DesiredState(
            generation=1, content_json=CONTENT, signature=signer.sign(message), signer_certificate=certificate
        )
        assert check.desired_state(NODE, desired) == "bad_signer", case
    good = wire.DesiredState(
        generation=1, content_json=CONTENT, signature=signer.sign(message), signer_certificate=signer.certify()
    )
    assert check.desired_state(NODE, good) is None


def test_a_command_passes_only_for_this_node_and_before_its_deadline() -> None:
    now = time.time()
    deadline_ms = int((now + 60) * 1000)
    command = SIGNER.command(NODE, "cmd_1", deadline_ms=deadline_ms)
    assert _check(clock=now).command(NODE, command) is None
    assert _check(clock=now + 61).command(NODE, command) == "expired"
    assert _check(clock=now).command("node_another", command) == "bad_signature"
    renamed = wire.Command(
        id="cmd_2",
        kind=command.kind,
        arguments_json=command.arguments_json,
        deadline_ms=deadline_ms,
        signature=command.signature,
        signer_certificate=command.signer_certificate,
    )
    assert _check(clock=now).command(NODE, renamed) == "bad_signature"
    later = wire.Command(
        id="cmd_1",
        kind=command.kind,
        arguments_json=command.arguments_json,
        deadline_ms=deadline_ms + 3_600_000,
        signature=command.signature,
        signer_certificate=command.signer_certificate,
    )
    assert _check(clock=now).command(NODE, later) == "bad_signature"


@given(st.binary(max_size=2048), st.binary(max_size=2048), st.text(max_size=64), st.integers(-(2**63), 2**63 - 1))
def test_any_bytes_get_a_reason_never_an_exception(
    signature: bytes, certificate: bytes, content: str, generation: int
) -> None:
    desired = wire.DesiredState(
        generation=generation, content_json=content, signature=signature, signer_certificate=certificate
    )
    assert _check().desired_state(NODE, desired) in ("unsigned", "bad_signer", "bad_signature")
