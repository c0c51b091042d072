"""``bcd node`` renews its certificate over the wire, and joins again through reclaim once it expired while the
daemon was stopped: real ``bcd`` processes, a real gateway, and node certificates that live seconds
(``JoinSettings.certificate_ttl``; the CA backdates ``notBefore`` by a minute, so 75 s leaves about 15 s).

The plane's clock follows the wall clock here: the certificates expire in real time, which the gateway's TLS
handshake and the daemon read too."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import shlex
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from grpclib.exceptions import GRPCError

import bettercompute_proto as wire
from bettercompute.modules.commands import COMMANDS
from bettercompute.modules.nodes import CERTIFICATES, NODES
from bettercompute.testing import ManualClock
from bettercompute_daemon.identity import NodeKey
from bettercompute_gateway import create_gateway
from tests._timing import deadline

from .conftest import Wire, envelope
from .test_daemon import BCD, STOPPED, fake_inventory, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.e2e]

EXPIRED = 4


class WallClock(ManualClock):
    """A ``ManualClock`` that reads the wall clock: the certificates of these tests expire in real time."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


@pytest.fixture
def clock() -> ManualClock:
    return WallClock()


@pytest.fixture
def certificate_ttl() -> dt.timedelta:
    return dt.timedelta(seconds=75)


class Node:
    """A machine with ``bcd``: its state directory and fake inventory, and the ``bcd node`` process while it runs."""

    def __init__(self, gw: Wire, folder: Path, serial: str) -> None:
        self.gw = gw
        self.state = folder / "bcd"
        self.common = ["--state-dir", str(self.state), "--fake-inventory", str(fake_inventory(folder, serial))]
        self.daemon: asyncio.subprocess.Process | None = None

    async def join(self, token: str, printed: str, *more: str) -> None:
        """``bcd join`` as ``join-tokens.create`` printed it, with the test gateway's address."""
        words = shlex.split(printed)
        assert words[:2] == ["bcd", "join"]
        options: dict[str, str] = {}
        rest = iter(words[2:])
        for word in rest:  # "--name value", or "--name=value" (the join key: it may start with "-")
            name, equals, value = word.partition("=")
            options[name] = value if equals else next(rest)
        options["--gateway"] = f"127.0.0.1:{self.gw.port}"
        args = [f"{name}={value}" for name, value in options.items()]
        joined = await anyio.run_process([BCD, *self.common, "join", *args, *more], check=False)
        assert joined.returncode == 0, joined.stderr.decode()
        assert token.encode() not in joined.stdout + joined.stderr

    def identity(self) -> dict[str, str | int]:
        value: dict[str, str | int] = json.loads((self.state / "node.json").read_text())
        return value

    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate((self.state / "node.crt").read_bytes())

    async def start(self) -> None:
        self.daemon = await asyncio.create_subprocess_exec(
            BCD, *self.common, "node", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )

    async def stop(self) -> str:
        """Stop ``bcd node`` (SIGTERM) and return what it logged."""
        assert self.daemon is not None
        if self.daemon.returncode is None:
            self.daemon.terminate()
        _, stderr = await self.daemon.communicate()
        return stderr.decode()

    async def finish(self, seconds: float = 15) -> tuple[int, str]:
        """Wait for ``bcd node`` to exit by itself: its status and what it logged."""
        assert self.daemon is not None
        with anyio.fail_after(deadline(seconds)):
            _, stderr = await self.daemon.communicate()
        assert self.daemon.returncode is not None
        return self.daemon.returncode, stderr.decode()

    async def wait_expired(self) -> None:
        """Sleep until the certificate on disk has expired."""
        not_after = int(self.identity()["not_after_ms"]) / 1000
        await anyio.sleep(max(0.0, not_after - time.time()) + 0.5)
        assert self.certificate().not_valid_after_utc.timestamp() < time.time()


@pytest.fixture
async def machines(gw: Wire, tmp_path: Path) -> AsyncIterator[list[Node]]:
    made: list[Node] = []
    try:
        yield made
    finally:
        for node in made:
            if node.daemon is not None and node.daemon.returncode is None:
                node.daemon.kill()
                await node.daemon.wait()


def machine(gw: Wire, tmp_path: Path, machines: list[Node], serial: str) -> Node:
    folder = tmp_path / serial
    folder.mkdir()
    node = Node(gw, folder, serial)
    machines.append(node)
    return node


async def test_bcd_node_renews_its_certificate_over_the_wire_before_it_expires(
    gw: Wire, tmp_path: Path, machines: list[Node]
) -> None:
    node = machine(gw, tmp_path, machines, "SN-RENEW-1")
    token = await gw.fleet.token()
    await node.join(token.token, token.join_command)
    first = node.identity()
    node_id = str(first["node_id"])
    first_pem = (node.state / "node.crt").read_text()
    first_key = (node.state / "node.key").read_bytes()
    await node.start()
    await wait_for(lambda: _in_session(gw, node_id, 1))

    async def renewed() -> bool:
        return node.identity()["serial"] != first["serial"]

    # Renewed at about two thirds of the ~15 s the certificate had left: well before it expires.
    await wait_for(renewed, seconds=max(1.0, int(first["not_after_ms"]) / 1000 - time.time()))
    # The first certificate is still valid, but it is superseded: only the newest certificate renews.
    channel = gw.channel(key_pem=first_key, cert_pem=first_pem)
    try:
        stub = wire.NodeStub(channel)
        challenge = (await stub.renew_challenge(wire.RenewChallengeRequest())).challenge
        csr_pem = NodeKey().csr_pem()
        proof = NodeKey(_key(first_key)).renewal_proof(challenge, csr_pem)
        with pytest.raises(GRPCError) as caught:
            await stub.renew(wire.RenewRequest(challenge=challenge, signature=proof, csr_pem=csr_pem))
        assert envelope(caught.value)["details"]["reason"] == "superseded"
    finally:
        channel.close()

    second = node.identity()
    assert second["node_id"] == node_id
    certificate = node.certificate()
    assert format(certificate.serial_number, "x") == second["serial"]
    assert certificate.not_valid_after_utc.timestamp() * 1000 == second["not_after_ms"]
    # A new key each time, beside its certificate, kept as privately as the first.
    key = _key((node.state / "node.key").read_bytes())
    assert (node.state / "node.key").read_bytes() != first_key
    assert _spki(key.public_key()) == _spki(certificate.public_key())
    for name in ("node.crt", "node.key", "node.json", "ca-bundle.pem"):
        assert stat.S_IMODE((node.state / name).stat().st_mode) == 0o600, name
    assert not (node.state / "renewal.key").exists()
    # The control plane recorded it as the node's newest certificate; the first is not revoked.
    certificates = gw.fleet.store.repository(CERTIFICATES)
    spiffe_id = gw.fleet.services.joins.ca.spiffe_id(node_id)
    newest = await certificates.newest(spiffe_id)
    assert newest is not None and newest.serial in {second["serial"], node.identity()["serial"]}
    assert not await certificates.is_revoked(str(first["serial"]))
    # The live session was kept through the renewal, and its results are still signed with the key it opened with.
    assert gw.gateway.sessions.get(node_id) == 1
    record = await gw.fleet.store.repository(NODES).get(node_id)
    assert record is not None
    command = await gw.fleet.command(record)

    async def finished() -> bool:
        done = await gw.fleet.store.repository(COMMANDS).get(command.id)
        return done is not None and done.state == "succeeded"

    await wait_for(finished)
    assert gw.gateway.sessions.get(node_id) == 1
    # ... and the next one opens with a renewed certificate.
    port, tls, options = gw.port, gw.gateway._tls, gw.gateway.options
    await gw.gateway.close()
    gw.gateway = create_gateway(gw.fleet.services, gw.fleet.store, tls, options)
    await gw.gateway.start("127.0.0.1", port)
    await wait_for(lambda: _in_session(gw, node_id, 2))
    assert gw.gateway._sessions[node_id].serial != first["serial"]

    logged = await node.stop()
    assert "certificate renewed" in logged
    assert token.token not in logged and "PRIVATE KEY" not in logged


@pytest.mark.parametrize("certificate_ttl", [dt.timedelta(seconds=66)])
async def test_a_renewal_refused_for_a_revoked_certificate_stops_the_daemon(
    gw: Wire, tmp_path: Path, machines: list[Node]
) -> None:
    node = machine(gw, tmp_path, machines, "SN-REVOKED-1")
    token = await gw.fleet.token()
    await node.join(token.token, token.join_command)
    first = node.identity()
    node_id = str(first["node_id"])
    await node.start()
    await wait_for(lambda: _in_session(gw, node_id, 1))

    async def renewed() -> bool:
        return node.identity()["serial"] != first["serial"]

    await wait_for(renewed)
    # Only the renewed certificate is revoked: the session, opened with the first one, stays up; the next renewal is
    # refused, and the daemon stops as it does when the gateway closes its session for that reason.
    await gw.fleet.services.joins.ca.revoke(str(node.identity()["serial"]), reason="a test")
    code, logged = await node.finish()
    assert code == STOPPED
    assert "the certificate renewal was refused: the certificate was revoked" in logged
    assert "certificate_revoked" in logged and "stopping" in logged


@pytest.mark.parametrize("certificate_ttl", [dt.timedelta(seconds=64)])
async def test_a_certificate_that_expired_while_stopped_is_replaced_through_reclaim(
    gw: Wire, tmp_path: Path, machines: list[Node]
) -> None:
    node = machine(gw, tmp_path, machines, "SN-REENROL-1")
    token = await gw.fleet.token(uses=3, reclaim="same-hardware")
    await node.join(token.token, token.join_command, "--keep-token")
    kept = node.state / "reenroll.token"
    assert kept.read_text() == token.token and stat.S_IMODE(kept.stat().st_mode) == 0o600
    node_id = str(node.identity()["node_id"])
    pinned = (node.state / "pinned-ca.pem").read_bytes()
    await node.start()
    await wait_for(lambda: _in_session(gw, node_id, 1))
    await node.stop()
    before = node.identity()  # a renewal may have come before the stop
    await node.wait_expired()
    # What gateways handed over since the join (a renewal's bundle passes through one) is not an anchor: a
    # re-enrolment keeps the pin the join made.
    (node.state / "ca-bundle.pem").write_bytes(b"# a gateway's own CA could be here\n" + pinned)

    await node.start()
    await wait_for(lambda: _in_session(gw, node_id, 2))
    after = node.identity()
    assert after["node_id"] == node_id and after["serial"] != before["serial"]
    assert (node.state / "pinned-ca.pem").read_bytes() == pinned
    record = await gw.fleet.store.repository(NODES).get(node_id)
    assert record is not None and record.enrollments == 2
    # The reclaim revoked what the node held before.
    assert await gw.fleet.store.repository(CERTIFICATES).is_revoked(str(before["serial"]))
    logged = await node.stop()
    assert f"re-enrolled: node {node_id} is back (reclaimed)" in logged
    assert token.token not in logged


@pytest.mark.parametrize("certificate_ttl", [dt.timedelta(seconds=62)])
async def test_an_expired_node_without_a_token_stops_with_its_own_status(
    gw: Wire, tmp_path: Path, machines: list[Node]
) -> None:
    node = machine(gw, tmp_path, machines, "SN-EXPIRED-1")
    token = await gw.fleet.token(uses=2, reclaim="same-hardware")
    await node.join(token.token, token.join_command)
    assert not (node.state / "reenroll.token").exists()
    node_id = str(node.identity()["node_id"])
    await node.wait_expired()
    await node.start()
    code, logged = await node.finish()
    assert code == EXPIRED != STOPPED
    assert f"the certificate of node {node_id} expired at" in logged
    assert "no re-enrolment token" in logged and "bcd join" in logged
    assert len(logged.strip().splitlines()) == 1
    assert node_id not in gw.gateway.sessions


@pytest.mark.parametrize("certificate_ttl", [dt.timedelta(seconds=62)])
@pytest.mark.parametrize(
    ("uses", "reclaim", "reason"),
    [(1, "same-hardware", "token_exhausted"), (2, "none", "hardware_taken")],
)
async def test_a_refused_re_enrolment_says_why_and_stops(
    gw: Wire, tmp_path: Path, machines: list[Node], uses: int, reclaim: str, reason: str
) -> None:
    node = machine(gw, tmp_path, machines, "SN-REFUSED-1")
    token = await gw.fleet.token(uses=uses, reclaim=reclaim)
    await node.join(token.token, token.join_command, "--keep-token")
    await node.wait_expired()
    await node.start()
    code, logged = await node.finish()
    assert code == EXPIRED
    assert "could not re-enrol node" in logged and reason in logged
    assert token.token not in logged


async def _in_session(gw: Wire, node_id: str, epoch: int) -> bool:
    return gw.gateway.sessions.get(node_id) == epoch


def _key(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return key


def _spki(public_key: object) -> bytes:
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
