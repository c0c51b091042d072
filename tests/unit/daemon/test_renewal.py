"""When ``bcd node`` renews, what a renewal interrupted by a crash leaves and how the next start finishes it, and
that a failing renewal waits before trying again. Certificates here are self-signed stand-ins written to a real
state directory; the renewal over the wire is tested against a real gateway (``tests/integration/gateway``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import socket
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID
from grpclib.client import Channel

from bettercompute_daemon._renewal import PENDING_KEY, Credentials, Renewer, settle
from bettercompute_daemon._state import NodeIdentity, StateDir
from bettercompute_daemon.identity import NodeKey

NODE_ID = "node_0123456789abcdef"
UNIT = Path(__file__).parents[3] / "bettercompute_daemon" / "systemd" / "bcd.service"


def certificate(key: NodeKey, *, not_before: float, not_after: float, serial: int = 0x1234) -> str:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE_ID)])
    built = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.private_key.public_key())
        .serial_number(serial)
        .not_valid_before(dt.datetime.fromtimestamp(not_before, dt.UTC))
        .not_valid_after(dt.datetime.fromtimestamp(not_after, dt.UTC))
        .sign(key.private_key, hashes.SHA256())
    )
    return built.public_bytes(serialization.Encoding.PEM).decode()


def joined(tmp_path: Path, *, not_before: float, not_after: float) -> tuple[StateDir, NodeKey]:
    """A state directory as ``bcd join`` leaves it."""
    state = StateDir(tmp_path / "bcd")
    key = NodeKey()
    pem = certificate(key, not_before=not_before, not_after=not_after)
    identity = NodeIdentity(node_id=NODE_ID, serial="1234", not_after_ms=round(not_after * 1000))
    state.save_identity(identity, key_pem=key.private_key_pem(), certificate_pem=pem, bundle_pem=pem)
    return state, key


def test_a_renewal_falls_at_about_two_thirds_of_the_life_the_node_saw(tmp_path: Path) -> None:
    now = time.time()
    # Backdated by a minute, as the CA does: two thirds of 90 s from notBefore would be now, and the node would
    # renew as soon as it got the certificate. Counted from when it was written: two thirds of the 30 s it has.
    state, _ = joined(tmp_path, not_before=now - 60, not_after=now + 30)
    points = [Credentials.load(state).renew_at for _ in range(200)]
    assert all(now + 30 * 0.63 - 1 <= point <= now + 30 * 0.70 + 1 for point in points)
    assert max(points) - min(points) > 0.5  # jittered: nodes that joined together do not renew together
    assert not Credentials.load(state).expired()


def test_a_certificate_past_two_thirds_renews_at_once_and_an_expired_one_is_expired(tmp_path: Path) -> None:
    now = time.time()
    state, _ = joined(tmp_path, not_before=now - 20 * 3600, not_after=now + 4 * 3600)
    os.utime(state.path / "node.crt", (now - 20 * 3600, now - 20 * 3600))  # the machine was off since
    assert Credentials.load(state).renew_at < now
    state, _ = joined(tmp_path, not_before=now - 3600, not_after=now - 1)
    assert Credentials.load(state).expired()


def test_a_renewal_that_stopped_between_its_certificate_and_its_key_is_finished_on_start(tmp_path: Path) -> None:
    now = time.time()
    state, old_key = joined(tmp_path, not_before=now - 60, not_after=now + 3600)
    new_key = NodeKey()
    state.write(PENDING_KEY, new_key.private_key_pem())
    state.write("node.crt", certificate(new_key, not_before=now - 60, not_after=now + 7200, serial=0xBEEF).encode())
    with pytest.raises(ValueError, match="not the key of the node certificate"):
        Credentials.load(state)
    settle(state)
    assert state.read("node.key") == new_key.private_key_pem()
    assert not (state.path / PENDING_KEY).exists()
    identity = state.identity()
    assert identity is not None and identity.serial == "beef" and identity.node_id == NODE_ID
    assert Credentials.load(state).not_after == pytest.approx(now + 7200, abs=1)
    assert old_key.private_key_pem() != state.read("node.key")


def test_a_renewal_whose_answer_was_lost_is_asked_again_with_the_same_key(tmp_path: Path) -> None:
    now = time.time()
    state, key = joined(tmp_path, not_before=now - 60, not_after=now + 3600)
    pending = NodeKey()
    state.write(PENDING_KEY, pending.private_key_pem())
    renewer = Renewer(state, lambda: Channel("127.0.0.1", 1))  # settles: the certificate is still the old key's
    assert state.read("node.key") == key.private_key_pem()
    assert renewer._pending_key().private_key_pem() == pending.private_key_pem()
    # Without one under way, a renewal makes a new key and keeps it before it asks.
    (state.path / PENDING_KEY).unlink()
    made = renewer._pending_key()
    assert state.read(PENDING_KEY) == made.private_key_pem() != key.private_key_pem()


@pytest.mark.anyio
async def test_a_failed_renewal_is_logged_once_and_waits_before_trying_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = time.time()
    state, _ = joined(tmp_path, not_before=now - 3600, not_after=now + 60)
    os.utime(state.path / "node.crt", (now - 3600, now - 3600))  # due already
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    renewer = Renewer(state, lambda: Channel("127.0.0.1", port))
    with caplog.at_level(logging.INFO, logger="bcd"), pytest.raises(TimeoutError):
        await asyncio.wait_for(renewer.run(), 1.0)
    lines = [r.getMessage() for r in caplog.records if r.name == "bcd"]
    assert len(lines) == 1, lines  # one attempt in that second, not a loop
    assert lines[0].startswith("the certificate was not renewed: the gateway could not be reached")
    assert "trying again in" in lines[0]


def test_the_unit_does_not_restart_a_daemon_whose_identity_is_gone_or_expired() -> None:
    settings = dict(
        line.split("=", 1) for line in UNIT.read_text().splitlines() if "=" in line and not line.startswith("#")
    )
    assert settings["Restart"] == "on-failure"
    assert set(settings["RestartPreventExitStatus"].split()) == {"3", "4"}
