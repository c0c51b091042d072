"""A command's result counts only if its node's key signed it, checked where it is used (the lifecycle controller),
not only where the gateway received it.

Each case plays a gateway that turned: it answers a node's acceptance check itself, through the same door a gateway
has into the store (``EDGE``), with a result the node never signed. The node stays ``adopting``, its devices stay
out of capacity, the refusal is audited once and counted; the genuine result, signed by the node's key, adopts.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
from typing import Any

import anyio
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import bettercompute_proto as wire
from bettercompute.modules.audit import ListAuditInput
from bettercompute.modules.commands import EDGE, SignedAck
from bettercompute.modules.inventory import INVENTORY, verify_facts
from bettercompute.modules.nodes import (
    FACT_REFUSED_ACTION,
    NODES,
    SignedFact,
    command_result_message,
    desired_ack_message,
    inventory_section_message,
)
from bettercompute_daemon.identity import NodeKey
from tests._timing import deadline

from ..cli.conftest import command
from .conftest import Joined, Wire, hello, session_request, signed_section
from .test_lifecycle import settle

pytestmark = pytest.mark.anyio

HEALTHY = {"health": {"healthy": True, "gpus": [{"uuid": "GPU-f1", "ecc_uncorrectable": 0}]}, "fake": True}
BODY = json.dumps(HEALTHY, sort_keys=True)


def _spki(key: NodeKey) -> bytes:
    return key.private_key.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)


async def _tick(gw: Wire) -> None:
    """One pass of the controllers, the manual clock kept up with the database's (which dates the gateway's work)."""
    gw.fleet.clock.set(max(gw.fleet.clock.now(), dt.datetime.now(dt.UTC)))
    await gw.fleet.compute.jobs.tick({"controllers"})


async def _dispatched_check(gw: Wire, joined: Joined, stream: Any) -> tuple[str, int]:
    """Report the node's GPUs on its session and wait for the diag.nvml command it is sent; its id and the epoch."""
    await stream.send_request()
    await stream.send_message(hello(joined.node_id))
    gpus = json.dumps([{"uuid": f"GPU-{joined.node_id}", "model": "H100"}])  # its own: no conflict
    with anyio.fail_after(deadline(30)):
        while (welcome := await stream.recv_message()) is not None and welcome.welcome is None:
            pass
    assert welcome is not None
    epoch = int(welcome.welcome.epoch)
    await stream.send_message(wire.NodeFrame(inventory=signed_section(joined, "gpus", gpus, epoch=epoch)))
    sent: list[wire.Command] = []

    async def read() -> None:
        async for frame in stream:
            if frame.command is not None:
                sent.append(frame.command)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        with anyio.fail_after(deadline(30)):
            while not any(c.kind == "diag.nvml" for c in sent):
                await _tick(gw)
                await anyio.sleep(0.1)
        tg.cancel_scope.cancel()
    record = await gw.fleet.store.repository(NODES).get(joined.node_id)
    assert record is not None
    return next(c.id for c in sent if c.kind == "diag.nvml"), record.session_epoch


def _signed(key: NodeKey, *, command_id: str, epoch: int, body: str = BODY, kind: str = "diag.nvml") -> bytes:
    message = command_result_message(
        command_id=command_id, kind=kind, outcome="succeeded", result_json=body, epoch=epoch
    )
    return key.sign(message)


async def _answer_as_the_gateway(gw: Wire, joined: Joined, forge: Any) -> tuple[str, int]:
    """Open the node's session, let its check be dispatched, and finish it through the gateway's door with what
    ``forge(command_id, epoch)`` returns (result text, signature, serial, key); the command id and epoch."""
    channel = gw.channel(joined)
    try:
        async with session_request(channel) as stream:
            command_id, epoch = await _dispatched_check(gw, joined, stream)
            body, signature, serial, key = forge(command_id, epoch)
            finished = await gw.fleet.store.repository(EDGE).finish(
                id=command_id,
                epoch=epoch,
                state="succeeded",
                result_json=body,
                reason=None,
                signed=SignedFact(signature=signature, serial=serial, key=key),
            )
            assert finished is not None and finished.state == "succeeded"
            await stream.end()
    finally:
        channel.close()
    return command_id, epoch


async def _refusals(gw: Wire, node_id: str) -> list[dict[str, Any]]:
    listed = await gw.fleet.compute.api.audit.list(gw.fleet.root, ListAuditInput(action=FACT_REFUSED_ACTION))
    return [dict(row.details) for row in listed.entries if row.resource_id == node_id]


def _counted(gw: Wire, reason: str) -> float:
    return float(gw.fleet.compute.context.metrics.facts_refused.labels("command_result", reason)._value.get())


async def test_results_the_node_never_signed_change_nothing_and_are_audited_once(gw: Wire) -> None:
    stranger = NodeKey(ec.generate_private_key(ec.SECP256R1()))
    cases = {
        # Signed by a key of the gateway's own, presented as the node's certificate's.
        "unknown_signer": lambda joined, command_id, epoch: (
            BODY,
            _signed(stranger, command_id=command_id, epoch=epoch),
            joined.serial,
            _spki(stranger),
        ),
        # The node's key and serial, but the result altered after it was signed.
        "bad_signature": lambda joined, command_id, epoch: (
            BODY.replace('"healthy": true', '"healthy": false '),
            _signed(joined.key, command_id=command_id, epoch=epoch),
            joined.serial,
            _spki(joined.key),
        ),
        # No signature at all.
        "unsigned": lambda joined, command_id, epoch: (BODY, b"", joined.serial, _spki(joined.key)),
    }
    for n, (reason, forge) in enumerate(sorted(cases.items())):
        joined = await gw.join(f"SN-FORGED-{n}")
        before = _counted(gw, reason)
        command_id, _ = await _answer_as_the_gateway(gw, joined, lambda c, e, j=joined, f=forge: f(j, c, e))
        record = await _wait_refused(gw, joined.node_id)
        assert record.state == "adopting", reason
        assert record.acceptance["refused"] == {command_id: reason}
        assert _counted(gw, reason) == before + 1
        # More passes of the controller: nothing moves, nothing is audited twice.
        for _ in range(3):
            await _tick(gw)
        assert (await gw.fleet.store.repository(NODES).get(joined.node_id)).state == "adopting"  # type: ignore[union-attr]
        refusals = await _refusals(gw, joined.node_id)
        assert [(r["fact"], r["check"], r["command_id"], r["reason"]) for r in refusals] == [
            ("command_result", "diag.nvml", command_id, reason)
        ]


async def _wait_refused(gw: Wire, node_id: str) -> Any:
    with anyio.fail_after(deadline(30)):
        while True:
            await _tick(gw)
            record = await gw.fleet.store.repository(NODES).get(node_id)
            if record is not None and record.acceptance.get("refused"):
                return record
            await anyio.sleep(0.05)


async def test_a_genuine_result_replayed_under_another_command_is_refused_and_the_genuine_one_adopts(
    gw: Wire,
) -> None:
    first = await gw.join("SN-GENUINE")
    signed: dict[str, Any] = {}

    def genuine(command_id: str, epoch: int) -> tuple[str, bytes, str, bytes]:
        signature = _signed(first.key, command_id=command_id, epoch=epoch)
        signed.update(command_id=command_id, epoch=epoch, signature=signature)
        return BODY, signature, first.serial, _spki(first.key)

    await _answer_as_the_gateway(gw, first, genuine)
    adopted = await settle(gw, first.node_id, lambda n: n.state == "adopted")
    assert adopted.state == "adopted"

    # The same signed bytes, replayed by the gateway as the answer to a second node's check, under its own serial
    # and key: the signature covers the first command's id, and the first node's key is not the second's.
    second = await gw.join("SN-REPLAYED")
    for serial, key, reason in (
        (second.serial, _spki(second.key), "bad_signature"),
        (first.serial, _spki(first.key), "unknown_signer"),
    ):
        joined = second if reason == "bad_signature" else await gw.join("SN-REPLAYED-2")
        before = _counted(gw, reason)
        await _answer_as_the_gateway(
            gw,
            joined,
            lambda command_id, epoch, s=serial, k=key: (BODY, signed["signature"], s, k),
        )
        record = await _wait_refused(gw, joined.node_id)
        assert record.state == "adopting"
        assert list(record.acceptance["refused"].values()) == [reason]
        assert _counted(gw, reason) == before + 1


async def test_an_inventory_section_the_node_never_signed_leaves_its_devices_as_they_were(gw: Wire) -> None:
    fleet = gw.fleet
    joined = await gw.join("SN-INVENTORY")
    edge = fleet.store.repository(EDGE)
    genuine = json.dumps([{"uuid": "GPU-real", "model": "H100"}])
    # The node's own report, relayed as an honest gateway relays it.
    signature = joined.key.sign(inventory_section_message(section="gpus", content_json=genuine, fake=False, epoch=1))
    assert await edge.record_inventory(
        joined.node_id,
        "gpus",
        genuine,
        fake=False,
        epoch=1,
        signed=SignedFact(signature=signature, serial=joined.serial, key=_spki(joined.key)),
    )
    await _devices_become(gw, joined.node_id, {"GPU-real"})

    stranger = NodeKey(ec.generate_private_key(ec.SECP256R1()))
    forged = json.dumps([{"uuid": "GPU-real", "model": "H100"}, {"uuid": "GPU-invented", "model": "H100"}])
    cases = {
        "unknown_signer": SignedFact(
            signature=stranger.sign(
                inventory_section_message(section="gpus", content_json=forged, fake=False, epoch=1)
            ),
            serial=joined.serial,
            key=_spki(stranger),
        ),
        "bad_signature": SignedFact(signature=signature, serial=joined.serial, key=_spki(joined.key)),  # over genuine
        "unsigned": SignedFact(signature=b"", serial=joined.serial, key=_spki(joined.key)),
    }
    for reason, signed in cases.items():
        before = _counted_as(gw, "inventory_section", reason)
        assert await edge.record_inventory(joined.node_id, "gpus", forged, fake=False, epoch=1, signed=signed)
        with anyio.fail_after(deadline(30)):
            while (await _section(gw, joined.node_id)).checked is None:
                await _tick(gw)
        assert (await _section(gw, joined.node_id)).checked == reason
        for _ in range(3):
            await _tick(gw)
        devices = await fleet.store.repository(INVENTORY).devices(joined.node_id)
        assert {d.ident for d in devices} == {"GPU-real"}, reason  # nothing invented, nothing lost
        assert _counted_as(gw, "inventory_section", reason) == before + 1
        refusals = [r for r in await _refusals(gw, joined.node_id) if r["reason"] == reason]
        assert [(r["fact"], r["section"]) for r in refusals] == [("inventory_section", "gpus")]


async def _section(gw: Wire, node_id: str) -> Any:
    [section] = [r for r in await gw.fleet.store.repository(NODES).inventory(node_id) if r.section == "gpus"]
    return section


async def _devices_become(gw: Wire, node_id: str, idents: set[str]) -> None:
    with anyio.fail_after(deadline(30)):
        while {d.ident for d in await gw.fleet.store.repository(INVENTORY).devices(node_id)} != idents:
            await _tick(gw)
            await anyio.sleep(0.05)


def _counted_as(gw: Wire, fact: str, reason: str) -> float:
    return float(gw.fleet.compute.context.metrics.facts_refused.labels(fact, reason)._value.get())


async def test_an_acknowledgement_the_node_never_signed_is_refused_before_anything_binds_on_it(gw: Wire) -> None:
    fleet = gw.fleet
    edge = fleet.store.repository(EDGE)
    stranger = NodeKey(ec.generate_private_key(ec.SECP256R1()))
    for n, reason in enumerate(("unknown_signer", "bad_signature", "unsigned", "ok")):
        joined = await gw.join(f"SN-ACK-{n}")
        desired = await fleet.desire(joined.node_id, {"allocations": []})
        generation = desired.generation
        right = joined.key.sign(desired_ack_message(generation=generation, epoch=1))
        signed = {
            "unknown_signer": SignedFact(
                signature=stranger.sign(desired_ack_message(generation=generation, epoch=1)),
                serial=joined.serial,
                key=_spki(stranger),
            ),
            "bad_signature": SignedFact(signature=right, serial=joined.serial, key=_spki(joined.key)),
            "unsigned": SignedFact(signature=b"", serial=joined.serial, key=_spki(joined.key)),
            "ok": SignedFact(signature=right, serial=joined.serial, key=_spki(joined.key)),
        }[reason]
        # bad_signature: the node's real signature, over another epoch than the one claimed
        epoch = 2 if reason == "bad_signature" else 1
        before = _counted_as(gw, "desired_ack", reason)
        ack = SignedAck(node_id=joined.node_id, generation=generation, epoch=epoch, signed=signed)
        assert await edge.observe([ack]) == [joined.node_id]
        with anyio.fail_after(deadline(30)):
            while (record := await fleet.store.repository(NODES).get(joined.node_id)) is not None and (
                record.observed_checked is None
            ):
                await _tick(gw)
        assert record is not None and record.observed_generation == generation
        assert record.observed_checked == reason
        refusals = [r for r in await _refusals(gw, joined.node_id) if r["fact"] == "desired_ack"]
        if reason == "ok":
            assert refusals == []
        else:
            assert _counted_as(gw, "desired_ack", reason) == before + 1
            assert [(r["generation"], r["reason"]) for r in refusals] == [(generation, reason)]


async def test_a_reservation_binds_on_its_nodes_own_acknowledgement_not_on_a_forged_one(gw: Wire) -> None:
    from bettercompute.modules.reservations import Constraints, CreateReservationInput, ReservationsGroup

    fleet = gw.fleet
    joined = await gw.join("SN-BIND")

    def genuine(command_id: str, epoch: int) -> tuple[str, bytes, str, bytes]:
        return BODY, _signed(joined.key, command_id=command_id, epoch=epoch), joined.serial, _spki(joined.key)

    await _answer_as_the_gateway(gw, joined, genuine)
    adopted = await settle(gw, joined.node_id, lambda n: n.state == "adopted")
    group: ReservationsGroup[Any] = fleet.compute.api.group(ReservationsGroup)
    made = await group.create(
        fleet.alice,
        CreateReservationInput(
            tenant=fleet.acme, pool_id=adopted.pool_id, gpus=1, duration="PT1H", constraints=Constraints(model="H100")
        ),
    )
    assert made.state == "placed"
    with anyio.fail_after(deadline(30)):  # the controller gives the node a desired state that carries it
        while not any(
            a.get("id") == made.id
            for d in await fleet.store.repository(NODES).desired_newer([(joined.node_id, -1)])
            for a in d.content.get("allocations") or ()
        ):
            await _tick(gw)
    [carrying] = await fleet.store.repository(NODES).desired_newer([(joined.node_id, -1)])
    generation = carrying.generation
    edge = fleet.store.repository(EDGE)
    stranger = NodeKey(ec.generate_private_key(ec.SECP256R1()))
    forged = SignedFact(
        signature=stranger.sign(desired_ack_message(generation=generation, epoch=1)),
        serial=joined.serial,
        key=_spki(stranger),
    )
    assert await edge.observe([SignedAck(node_id=joined.node_id, generation=generation, epoch=1, signed=forged)])
    with anyio.fail_after(deadline(30)):
        while (await fleet.store.repository(NODES).get(joined.node_id)).observed_checked is None:  # type: ignore[union-attr]
            await _tick(gw)
    for _ in range(5):
        await _tick(gw)
    assert (await group.get(fleet.alice, _get(made.id))).state == "placed"  # nothing bound on the forged word

    # The node's own acknowledgement of the same generation replaces the refused one, and the reservation binds.
    own = SignedFact(
        signature=joined.key.sign(desired_ack_message(generation=generation, epoch=1)),
        serial=joined.serial,
        key=_spki(joined.key),
    )
    assert await edge.observe([SignedAck(node_id=joined.node_id, generation=generation, epoch=1, signed=own)])
    with anyio.fail_after(deadline(30)):
        while (await group.get(fleet.alice, _get(made.id))).state == "placed":
            await _tick(gw)
    assert (await group.get(fleet.alice, _get(made.id))).state in ("bound", "active")


def _get(reservation_id: str) -> Any:
    from bettercompute.modules.reservations import GetReservationInput

    return GetReservationInput(id=reservation_id)


async def test_every_stored_fact_can_be_checked_again_later_by_function_and_by_command(
    gw: Wire, database_url: str
) -> None:
    fleet = gw.fleet
    joined = await gw.join("SN-VERIFY")

    def genuine(command_id: str, epoch: int) -> tuple[str, bytes, str, bytes]:
        return BODY, _signed(joined.key, command_id=command_id, epoch=epoch), joined.serial, _spki(joined.key)

    command_id, _ = await _answer_as_the_gateway(gw, joined, genuine)
    await settle(gw, joined.node_id, lambda n: n.state == "adopted")
    # Then a section nobody signed lands (a gateway that turned); the good facts stay good.
    forged = SignedFact(signature=b"", serial=joined.serial, key=_spki(joined.key))
    assert await fleet.store.repository(EDGE).record_inventory(
        joined.node_id, "nics", "[]", fake=False, epoch=1, signed=forged
    )
    found = {(v.fact, v.id): v.verdict for v in await verify_facts(fleet.store, joined.node_id)}
    assert found[("command_result", command_id)] == "ok"
    assert found[("inventory_section", "gpus")] == "ok"
    assert found[("inventory_section", "nics")] == "unsigned"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTERCOMPUTE_")}
    env.update(BETTERCOMPUTE_DATABASE_URL=database_url, BETTERCOMPUTE_SCHEMA=fleet.store.schema)

    def verify(node_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command(), "facts", "verify", node_id],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=deadline(120),
        )

    done = await anyio.to_thread.run_sync(verify, joined.node_id)
    assert done.returncode == 1, done.stderr
    printed = {(line["fact"], line["id"]): line["verdict"] for line in map(json.loads, done.stdout.splitlines())}
    assert printed == found
    unknown = await anyio.to_thread.run_sync(verify, "node_nope")
    assert unknown.returncode != 0 and "NOT_FOUND" in unknown.stderr
    # Not an id: bytes that are no UTF-8 (an unpaired surrogate once decoded), a bidirectional mark, full-width
    # digits, a NUL-free but overlong id. Each is bad input, said as such, with nothing looked up.
    for bad in (os.fsdecode(b"node_\xff"), "node\u200f\uff11", "n" * 129):
        refused = await anyio.to_thread.run_sync(verify, bad)
        assert refused.returncode != 0 and "INVALID_INPUT" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
