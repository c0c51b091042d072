"""A gateway that turned: whatever it tries, it can delay or drop what passes through it, never forge what matters.

The gateway here is a real one in every part that an attacker would hold: it enrolled on the api's internal listener
with a one-time token (so it holds no KMS, CA or JoinService key), it logs in to PostgreSQL as the gateway role
``better-compute migrate`` makes, and real ``bcd sim`` nodes hold their sessions on it over mutual TLS. Its hostile
behaviour is injected where an attacker would put it: frames written into a node's session, results rewritten before
they are stored, calls through its own door into the store (``EDGE``) and its own channel to the api.

Each case asserts what a user would see: the node's state, its desired and observed generations, its devices, the
bookings and the usage are as they were; the refusal is audited (a fact the control plane refused) or reported by the
node itself (an instruction the daemon refused).
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from psycopg import errors, sql

import bettercompute_proto as wire
from bettercompute.errors import ComputeError
from bettercompute.modules.audit import ListAuditInput
from bettercompute.modules.commands import COMMANDS, EDGE, CommandRecord
from bettercompute.modules.nodes import (
    CERTIFICATES,
    FACT_REFUSED_ACTION,
    NODES,
    NodeRecord,
    RequalifyNodeInput,
    SignedFact,
    command_result_message,
    inventory_section_message,
)
from bettercompute_daemon.identity import NodeKey
from bettercompute_gateway import GatewayIdentity, InternalListener, create_gateway
from bettercompute_store_pg import PgStore, RoleNames
from bettercompute_store_pg.modules.commands._edge import PgEdge
from tests.integration.gateway.conftest import OPTIONS, Wire
from tests.integration.joins.conftest import Fleet
from tests.integration.sim.test_sim import Sim, all_in_session, join_flags, settle, sim, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

NAME = "gw-turned"
HOSTS = ("127.0.0.1", "localhost")
_PASSWORD = uuid.uuid4().hex


@attrs.define(kw_only=True)
class Turned:
    """The fleet, the turned gateway in front of it, its own store login, and two simulated nodes on it."""

    fleet: Fleet
    front: Wire
    store: PgStore
    roles: RoleNames
    gateway_url: str
    identity: GatewayIdentity
    sim: Sim
    nodes: list[NodeRecord]
    """Three nodes, adopted, each with its session on the turned gateway."""

    @property
    def victim(self) -> NodeRecord:
        return self.nodes[0]

    @property
    def other(self) -> NodeRecord:
        return self.nodes[1]

    @property
    def sessions(self) -> Any:
        return self.front.gateway._parts.sessions

    async def send(self, node_id: str, frame: wire.ControlFrame) -> None:
        """Write ``frame`` into the node's live session, as a gateway that turned would."""
        session = self.sessions.live_one(node_id)
        assert session is not None, "the node holds a session on the turned gateway"
        await self.sessions.send(session, frame)


def _as(url: str, role: str) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = f"{role}:{_PASSWORD}@{parts.hostname}:{parts.port or 5432}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
async def turned(fleet: Fleet, database_url: str, tmp_path: Path) -> AsyncIterator[Turned]:
    roles = await fleet.store.grant_roles(f"bcs_{uuid.uuid4().hex[:10]}")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(roles.gateway), sql.Literal(_PASSWORD)))
    gateway_url = _as(database_url, roles.gateway)
    store = PgStore(gateway_url, schema=fleet.store.schema, pool_size=2)
    await store.open()
    listener = InternalListener(fleet.services, name="api-security", hosts=HOSTS)
    port = await listener.start("127.0.0.1", 0)
    assert fleet.services.enrolment is not None
    token = await fleet.services.enrolment.mint(NAME)
    identity = GatewayIdentity(
        tmp_path / "gateway-state",
        name=NAME,
        hosts=HOSTS,
        addresses=[("127.0.0.1", port)],
        trust_domain=fleet.services.joins.ca.trust_domain,
        token=token,
    )
    services, tls, _ = await identity.open()
    gateway = create_gateway(services, store, tls, attrs.evolve(OPTIONS, name=NAME), metrics=fleet.compute.metrics)
    try:
        gateway_port = await gateway.start("127.0.0.1", 0)
        folder = tmp_path / "clients"
        folder.mkdir()
        made = Wire(
            fleet=fleet, gateway=gateway, port=gateway_port, trust_bundle_pem=tls.trust_bundle_pem, folder=folder
        )
        flags = await join_flags(made, uses=3)
        async with sim("--nodes", "3", "--seed", "30", "--state-dir", str(tmp_path / "nodes"), *flags) as running:
            await wait_for(lambda: all_in_session(made, 3))
            nodes = sorted(await settle(made, 3), key=lambda n: n.id)
            assert [n.state for n in nodes] == ["adopted"] * 3
            yield Turned(
                fleet=fleet,
                front=made,
                store=store,
                roles=roles,
                gateway_url=gateway_url,
                identity=identity,
                sim=running,
                nodes=nodes,
            )
    finally:
        await gateway.close()
        identity.close()
        await listener.close()
        await store.close()
        with psycopg.connect(database_url, autocommit=True) as conn:
            for role in roles.all():
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def _world(fleet: Fleet) -> dict[str, Any]:
    """What a user would notice changing: each node's state and generations, the devices and who holds them, the
    bookings and the usage recorded."""
    s = fleet.store.schema
    nodes = await fleet.store.fetch(
        fleet.store.sql("SELECT id, state, desired_generation, observed_generation FROM {s}.nodes ORDER BY id"), {}
    )
    devices = await fleet.store.fetch(
        fleet.store.sql("SELECT ident, node_id, state FROM {s}.devices ORDER BY ident, node_id"), {}
    )
    counts = await fleet.store.fetch(
        fleet.store.sql(
            "SELECT (SELECT count(*) FROM {s}.bookings) AS bookings, (SELECT count(*) FROM {s}.usage_records) AS usage"
        ),
        {},
    )
    assert s
    return {
        "nodes": [tuple(r) for r in nodes],
        "devices": [tuple(r) for r in devices],
        "bookings": counts[0].bookings,
        "usage": counts[0].usage,
    }


_REDISPATCH_SQL = "UPDATE {s}.commands SET state = 'dispatched', result = NULL WHERE id = :id RETURNING id"


async def _tick(fleet: Fleet, passes: int = 5) -> None:
    for _ in range(passes):
        fleet.clock.set(max(fleet.clock.now(), dt.datetime.now(dt.UTC)))
        await fleet.compute.jobs.tick({"controllers"})


async def _refusals(fleet: Fleet, node_id: str) -> list[dict[str, Any]]:
    listed = await fleet.compute.api.audit.list(fleet.root, ListAuditInput(action=FACT_REFUSED_ACTION))
    return [dict(row.details) for row in listed.entries if row.resource_id == node_id]


async def _node_reports(fleet: Fleet, node_id: str, kind: str) -> list[dict[str, Any]]:
    return [p["payload"] for k, p in await fleet.events("node.reported") if k == node_id and p["type"] == kind]


async def _requalified_check(t: Turned, node_id: str, held: list[wire.Command]) -> CommandRecord:
    """Requalify the node and hold back the acceptance check the gateway is to send it (a turned gateway answers it
    itself); the check's command, dispatched."""
    fleet = t.fleet
    sessions = t.sessions
    deliver = type(sessions).deliver.__get__(sessions)

    def withhold(session: Any, frame: wire.ControlFrame) -> None:
        if session.node_id == node_id and frame.command is not None:
            held.append(frame.command)
            return
        deliver(session, frame)

    sessions.deliver = withhold
    await fleet.compute.api.nodes.requalify(fleet.root, RequalifyNodeInput(id=node_id, reason="security test"))

    async def sent() -> bool:
        await _tick(fleet, 1)
        return bool(held)

    await wait_for(sent)
    sessions.deliver = deliver
    command: CommandRecord | None = await fleet.store.repository(COMMANDS).get(held[0].id)
    assert command is not None and command.state == "dispatched"
    return command


async def test_results_it_forges_alters_or_replays_change_nothing_and_are_audited(turned: Turned) -> None:
    """Cases 1 to 3: a result for a check it held back, made with a key of its own (1); the node's own result for
    the check, altered after the node signed it (2); the node's result of an earlier check, replayed under the new
    one (3), each on a node of its own. Each time the node stays ``adopting`` (requalified, waiting for a true
    answer), nothing else moves, and the refusal is audited with its reason."""
    t, fleet = turned, turned.fleet
    stranger = NodeKey(ec.generate_private_key(ec.SECP256R1()))
    stranger_key = stranger.private_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    healthy = json.dumps({"fake": True, "health": {"healthy": True, "gpus": []}}, sort_keys=True)
    edge = t.store.repository(EDGE)  # its own door, as the gateway role
    cases = (("forged", "unknown_signer"), ("replayed", "bad_signature"), ("altered", "bad_signature"))
    for node, (case, reason) in zip(t.nodes, cases, strict=True):
        node_id = node.id
        earlier = await fleet.store.repository(COMMANDS).get(node.acceptance["commands"]["diag.nvml"])
        assert earlier is not None and earlier.signed is not None and earlier.result_json is not None
        issued = await fleet.store.repository(CERTIFICATES).newest(fleet.services.joins.ca.spiffe_id(node_id))
        assert issued is not None
        held: list[wire.Command] = []
        command = await _requalified_check(t, node_id, held)
        epoch = command.session_epoch
        assert epoch is not None
        before = await _world(fleet)
        if case == "forged":
            message = command_result_message(
                command_id=command.id, kind=command.kind, outcome="succeeded", result_json=healthy, epoch=epoch
            )
            signed = SignedFact(signature=stranger.sign(message), serial=issued.serial, key=stranger_key)
            assert await edge.finish(
                id=command.id, epoch=epoch, state="succeeded", result_json=healthy, reason=None, signed=signed
            )
        elif case == "replayed":
            assert await edge.finish(
                id=command.id,
                epoch=epoch,
                state="succeeded",
                result_json=earlier.result_json,
                reason=None,
                signed=earlier.signed,
            )
        else:
            await _altered_on_the_way(t, node_id, held[0])
        await _tick(fleet)
        now = await fleet.store.repository(NODES).get(node_id)
        assert now is not None and now.state == "adopting", case
        assert await _world(fleet) == before, case
        assert [r["reason"] for r in await _refusals(fleet, node_id)] == [reason], case


async def _altered_on_the_way(t: Turned, node_id: str, command: wire.Command) -> None:
    """Send the node its check, and rewrite the node's signed result (healthy turned unhealthy and back) before it
    is stored, through the gateway's own door."""
    real_finish = PgEdge.finish

    async def altered(self: PgEdge, **kwargs: Any) -> CommandRecord | None:
        result = json.loads(kwargs["result_json"])
        result["health"]["healthy"] = not result["health"].get("healthy")
        return await real_finish(self, **{**kwargs, "result_json": json.dumps(result, sort_keys=True)})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PgEdge, "finish", altered)
        await t.send(node_id, wire.ControlFrame(command=command))

        async def answered() -> bool:
            done = await t.fleet.store.repository(COMMANDS).get(command.id)
            return done is not None and done.state == "succeeded"

        await wait_for(answered)


async def test_inventory_it_reports_for_a_node_changes_no_device_and_is_audited(turned: Turned) -> None:
    """Case 4: a ``gpus`` section for one node claiming the other node's GPUs, signed with a key of its own, and an
    unsigned one for the other node: both are refused where the inventory is used, no device changes hands or
    state, and each refusal is audited."""
    t, fleet = turned, turned.fleet
    before = await _world(fleet)
    victim_gpus = await _section(fleet, t.victim.id, "gpus")
    other_gpus = await _section(fleet, t.other.id, "gpus")
    claimed = json.dumps(json.loads(victim_gpus) + json.loads(other_gpus))
    stranger = NodeKey(ec.generate_private_key(ec.SECP256R1()))
    stranger_key = stranger.private_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    edge = t.store.repository(EDGE)
    for node, body, signer in ((t.victim, claimed, stranger), (t.other, other_gpus, None)):
        epoch = t.sessions.live_one(node.id).epoch
        message = inventory_section_message(section="gpus", content_json=body, fake=True, epoch=epoch)
        issued = await fleet.store.repository(CERTIFICATES).newest(fleet.services.joins.ca.spiffe_id(node.id))
        assert issued is not None
        signed = SignedFact(
            signature=signer.sign(message) if signer is not None else b"",
            serial=issued.serial,
            key=stranger_key if signer is not None else b"",
        )
        assert await edge.record_inventory(node.id, "gpus", body, fake=True, epoch=epoch, signed=signed)
    await _tick(fleet)
    assert await _world(fleet) == before
    assert [(r["fact"], r["reason"]) for r in await _refusals(fleet, t.victim.id)] == [
        ("inventory_section", "unknown_signer")
    ]
    assert [(r["fact"], r["reason"]) for r in await _refusals(fleet, t.other.id)] == [("inventory_section", "unsigned")]


async def _section(fleet: Fleet, node_id: str, name: str) -> str:
    [section] = [s for s in await fleet.store.repository(NODES).inventory(node_id) if s.section == name]
    assert section.content_json is not None
    return section.content_json


def _signer_of_its_own(trust_domain: str) -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    """A key and a certificate that look like the control plane's instruction signer (same SPIFFE ID form, code
    signing), under a CA of the gateway's own making."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Better Compute node CA")])
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sgk_forged")]))
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"spiffe://{trust_domain}/signer/sgk_forged")]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, certificate.public_bytes(serialization.Encoding.DER)


async def test_instructions_it_makes_up_or_alters_are_refused_by_the_node(turned: Turned) -> None:
    """Case 5: desired states and commands written into a node's session, unsigned, signed under a signer of its own,
    altered after the control plane signed them, or signed for another node. The daemon acts on none of them (no
    allocation, no acknowledgement, no command run) and reports each refusal; a forged generation far ahead does not
    poison its memory: the control plane's next desired state is applied and acknowledged."""
    t, fleet, node_id = turned, turned.fleet, turned.victim.id
    before = await _world(fleet)
    nodes = fleet.store.repository(NODES)
    [mine] = await nodes.desired_newer([(node_id, 0)])
    [theirs] = await nodes.desired_newer([(t.other.id, 0)])
    assert mine.instruction is not None and theirs.instruction is not None and mine.text is not None
    genuine = (await t.store.repository(EDGE).signers())[mine.instruction.signer]
    forged_key, forged_certificate = _signer_of_its_own(fleet.services.joins.ca.trust_domain)
    grab = json.dumps({"allocations": [{"id": "res_stolen", "gpus": ["GPU-0"], "mig": [], "tenant": fleet.globex}]})
    ahead = mine.generation + 1000

    def forged_signature(content: str, generation: int) -> bytes:
        message = wire.desired_state_message(node_id=node_id, generation=generation, content_json=content)
        return forged_key.sign(message, ec.ECDSA(hashes.SHA256()))

    states = [
        wire.DesiredState(generation=ahead, content_json=grab),
        wire.DesiredState(
            generation=ahead,
            content_json=grab,
            signature=forged_signature(grab, ahead),
            signer_certificate=forged_certificate,
        ),
        wire.DesiredState(
            generation=ahead,
            content_json=grab,
            signature=mine.instruction.signature,
            signer_certificate=genuine,
        ),
        wire.DesiredState(
            generation=theirs.generation,
            content_json=theirs.text or "",
            signature=theirs.instruction.signature,
            signer_certificate=genuine,
        ),
    ]
    for state in states:
        await t.send(node_id, wire.ControlFrame(desired_state=state))
    deadline_ms = int((dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)).timestamp() * 1000)
    commands = [
        wire.Command(id="cmd_made_up", kind="diag.nvml", arguments_json="{}", deadline_ms=deadline_ms),
        wire.Command(
            id="cmd_made_up_too",
            kind="diag.nvml",
            arguments_json="{}",
            deadline_ms=deadline_ms,
            signature=forged_key.sign(
                wire.command_message(
                    command_id="cmd_made_up_too",
                    node_id=node_id,
                    kind="diag.nvml",
                    arguments_json="{}",
                    deadline_ms=deadline_ms,
                ),
                ec.ECDSA(hashes.SHA256()),
            ),
            signer_certificate=forged_certificate,
        ),
    ]
    for command in commands:
        await t.send(node_id, wire.ControlFrame(command=command))

    async def reported() -> bool:
        refused = await _node_reports(fleet, node_id, "desired_state.refused")
        return len(refused) == 4 and len(await _node_reports(fleet, node_id, "command.refused")) == 2

    await wait_for(reported)
    refusals = [r["reason"] for r in await _node_reports(fleet, node_id, "desired_state.refused")]
    assert refusals == ["unsigned", "bad_signer", "bad_signature", "bad_signature"]
    assert [r["reason"] for r in await _node_reports(fleet, node_id, "command.refused")] == ["unsigned", "bad_signer"]
    assert await _world(fleet) == before

    desired = await fleet.desire(node_id, {**mine.content, "note": "the control plane's own"})

    async def applied() -> bool:
        node = await nodes.get(node_id)
        return node is not None and node.observed_generation == desired.generation

    await wait_for(applied)


async def test_its_own_database_role_reads_no_secret_token_or_key(turned: Turned) -> None:
    """Case 6: with the gateway's login, PostgreSQL itself refuses every read of the tables that hold secrets, join
    tokens and keys (there are rows to read: the fleet made a join token and its keys)."""
    t, fleet = turned, turned.fleet
    tables = ("secrets", "join_tokens", "join_keys", "ca_keys", "signing_keys", "certificates", "iam_credentials")
    counts = await fleet.store.fetch(
        fleet.store.sql(
            "SELECT (SELECT count(*) FROM {s}.join_tokens) AS tokens, (SELECT count(*) FROM {s}.signing_keys) AS keys"
        ),
        {},
    )
    assert counts[0].tokens >= 1 and counts[0].keys >= 1
    for table in tables:
        with psycopg.connect(t.gateway_url) as conn, pytest.raises(errors.InsufficientPrivilege):
            conn.execute(sql.SQL("SELECT * FROM {} LIMIT 1").format(sql.Identifier(fleet.store.schema, table)))


async def test_it_cannot_mint_a_certificate(turned: Turned) -> None:
    """Case 7: it holds no CA key (its process never had one), the api refuses a join without a genuine token, and
    the only certificate it can get renewed is its own, in role ``gateway``; no node certificate is added."""
    t, fleet = turned, turned.fleet
    services = t.identity.services
    assert services is not None and not hasattr(services, "joins")
    node_certificates = fleet.store.sql("SELECT count(*) AS n FROM {s}.certificates WHERE role = 'node'")
    before = (await fleet.store.fetch(node_certificates, {}))[0].n
    key = NodeKey()
    with pytest.raises(ComputeError):
        await services.join(sealed_token=b"\x01" * 96, csr_pem=key.csr_pem(), claims={"serial": "SN-MINTED"})
    renewed = await services.issue_server_certificate(key.csr_pem(), name="gw-someone-else", hosts=HOSTS)
    leaf = x509.load_pem_x509_certificate(renewed.certificate_pem.encode())
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    trust_domain = fleet.services.joins.ca.trust_domain
    assert names.get_values_for_type(x509.UniformResourceIdentifier) == [f"spiffe://{trust_domain}/gateway/{NAME}"]
    assert (await fleet.store.fetch(node_certificates, {}))[0].n == before
