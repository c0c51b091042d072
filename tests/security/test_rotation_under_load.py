"""Rotation under load (issue 30, item 5): twenty real ``bcd sim`` nodes hold their sessions over mutual TLS while
reservations keep being made, and every key rotates: the instruction key, JoinService's key, a webhook's signing
secret, the node CA's intermediate and the KMS key (every stored blob sealed again by the re-wrap). Then the old keys
are retired.

Nothing is lost: every reservation made during the rotations gets to ``active`` (each binds only once its node
applied a desired state signed by the key of that moment), no node refuses an instruction, every node renews onto
the new intermediate and is in session at the end, a join printed before JoinService's rotation works inside the
overlap, and a token sealed to the old key is refused once that key is retired.

The plane's clock follows the wall clock and node certificates live half a minute (the CA backdates ``notBefore``
by a minute), so the nodes renew every twenty seconds or so, as they would over a day.
"""

from __future__ import annotations

import datetime as dt
import shlex
from pathlib import Path
from typing import Any

import anyio
import pytest

from bettercompute import KmsRing, LocalKeyKms
from bettercompute.errors import UnauthenticatedError
from bettercompute.modules.nodes import (
    GetRewrapInput,
    ListKeysInput,
    RetireKeyInput,
    RotateKeyInput,
    StartRewrapInput,
)
from bettercompute.modules.reservations import CreateReservationInput, ReservationsGroup
from bettercompute.modules.webhooks import CreateWebhookInput, RotateWebhookSecretInput
from bettercompute.ports import Kms
from bettercompute.testing import GuardedKms, ManualClock
from bettercompute_daemon.identity import NodeKey, join_binding, seal_token
from tests.integration.gateway.conftest import Wire
from tests.integration.gateway.test_lifecycle import settle_reservation
from tests.integration.gateway.test_renewal import WallClock
from tests.integration.joins.conftest import claims
from tests.integration.sim.test_sim import all_in_session, join_flags, settle, sim, wait_for

pytestmark = [pytest.mark.anyio, pytest.mark.pg, pytest.mark.e2e]

NODES = 20
MAX_RESERVATIONS = 100
"""At most this many reservations of one GPU each (the simulated fleet has eight GPUs a node)."""


class SwitchedKms:
    """A test double standing for a rolling restart with a new KMS configuration: every call goes to the KMS it was
    last switched to (each one behind the guard that fails a KMS call made inside a transaction)."""

    def __init__(self, inner: Kms) -> None:
        self.inner = inner

    async def encrypt(self, plaintext: bytes, *, context: str) -> bytes:
        return await self.inner.encrypt(plaintext, context=context)

    async def decrypt(self, ciphertext: bytes, *, context: str) -> bytes:
        return await self.inner.decrypt(ciphertext, context=context)


@pytest.fixture
def clock() -> ManualClock:
    return WallClock()


@pytest.fixture
def certificate_ttl() -> dt.timedelta:
    return dt.timedelta(seconds=90)


@pytest.fixture
def kms(tmp_path: Path) -> SwitchedKms:
    return SwitchedKms(GuardedKms(LocalKeyKms(tmp_path / "old.key")))


async def _active(gw: Wire, kind: str, *, intermediate: bool = False) -> str:
    keys = (await gw.fleet.compute.api.keys.list(gw.fleet.root, ListKeysInput(kind=kind, limit=100))).keys  # type: ignore[arg-type]
    [key] = [k for k in keys if k.state == "active" and (k.issuer_id is not None) == intermediate]
    return key.id


async def _issuers(gw: Wire) -> dict[str, str]:
    """Each node's newest certificate's issuing CA key."""
    rows = await gw.fleet.store.fetch(
        gw.fleet.store.sql(
            "SELECT DISTINCT ON (node_id) node_id, ca_key_id FROM {s}.certificates WHERE role = 'node'"
            " ORDER BY node_id, issued_at DESC"
        ),
        {},
    )
    return {r.node_id: r.ca_key_id for r in rows}


async def test_every_key_rotates_while_twenty_nodes_stay_connected_and_reservations_flow(
    gw: Wire, tmp_path: Path, kms: SwitchedKms
) -> None:
    fleet, api = gw.fleet, gw.fleet.compute.api
    group: ReservationsGroup[Any] = api.group(ReservationsGroup)
    old_join_key = await fleet.join_key()
    hook = await api.webhooks.create(
        fleet.alice, CreateWebhookInput(tenant=fleet.acme, url="https://hooks.example.com/a")
    )
    printed_before = await fleet.token(uses=1)  # a join command printed before JoinService's key rotates
    stale_token = await fleet.token(uses=1)
    state = str(tmp_path / "nodes")
    async with sim(
        "--nodes", str(NODES), "--seed", "57", "--state-dir", state, *await join_flags(gw, uses=NODES)
    ) as fleet_sim:
        await wait_for(lambda: all_in_session(gw, NODES), seconds=120)
        nodes = await settle(gw, NODES, seconds=120)
        assert [n.state for n in nodes] == ["adopted"] * NODES
        made: list[str] = []
        stop = anyio.Event()

        async def load() -> None:  # a client making reservations all along (fewer than the fleet's GPUs)
            while not stop.is_set() and len(made) < MAX_RESERVATIONS:
                created = await group.create(
                    fleet.alice, CreateReservationInput(tenant=fleet.acme, pool_id=fleet.pool, gpus=1, duration="PT1H")
                )
                made.append(created.id)
                await anyio.sleep(1.0)

        async def worker() -> None:  # the controllers' jobs, as a worker process runs them
            while not stop.is_set():
                await fleet.compute.jobs.tick({"controllers"})
                await anyio.sleep(0.2)

        async with anyio.create_task_group() as tg:
            tg.start_soon(load)
            tg.start_soon(worker)
            old_signer = await _active(gw, "instructions")
            old_join = await _active(gw, "join")
            old_ca = await _active(gw, "ca", intermediate=True)
            root = await _active(gw, "ca")

            await api.keys.rotate(fleet.root, RotateKeyInput(kind="instructions"))
            await api.keys.rotate(fleet.root, RotateKeyInput(kind="join", overlap_seconds=600))
            # A tenant's webhook signing secret: two sign each delivery for the overlap.
            rotated_hook = await api.webhooks.rotate_secret(
                fleet.alice, RotateWebhookSecretInput(tenant=fleet.acme, id=hook.webhook.id, overlap_seconds=600)
            )
            assert rotated_hook.secret != hook.secret
            new_ca = (await api.keys.rotate(fleet.root, RotateKeyInput(kind="ca"))).id
            assert await _active(gw, "ca") == root  # the pin every daemon holds does not change

            # The KMS key: every process restarts with the new key and the old one beside it, the stored blobs
            # are sealed again, then the old key goes.
            old_kms = kms.inner
            new_kms = LocalKeyKms(tmp_path / "new.key")
            kms.inner = GuardedKms(KmsRing(new_kms, old_kms))
            rewrap = await api.keys.rewrap(fleet.root, StartRewrapInput())

            async def rewrapped() -> bool:
                now = await api.keys.get_rewrap(fleet.root, GetRewrapInput(id=rewrap.id))
                return now.state == "done"

            await wait_for(rewrapped, seconds=60)
            done = await api.keys.get_rewrap(fleet.root, GetRewrapInput(id=rewrap.id))
            # The CA's root and two intermediates, two instruction keys, two JoinService keys, two webhook secrets.
            assert done.failed == 0 and done.resealed >= 9
            kms.inner = GuardedKms(new_kms)

            # Every node renews onto the new intermediate (under the same root).
            async def renewed() -> bool:
                issuers = await _issuers(gw)
                return len(issuers) == NODES and set(issuers.values()) == {new_ca}

            await wait_for(renewed, seconds=90)

            # Inside JoinService's overlap, a command printed before its rotation joins a real node.
            flags = shlex.split(printed_before.join_command)
            flags[flags.index("--gateway") + 1] = f"127.0.0.1:{gw.port}"
            assert f"--join-key={old_join_key}" in flags
            async with sim("--nodes", "1", "--seed", "58", "--state-dir", str(tmp_path / "late"), *flags[2:]) as late:
                await wait_for(lambda: all_in_session(gw, NODES + 1), seconds=60)
                code, summary, stderr = await late.stop()
            assert code == 0 and summary["joined"] == 1, stderr

            # The old keys retire. The CA's intermediate early (force): what it issued and is still valid is revoked,
            # so a session opened with such a certificate closes and its node opens the next with its new one.
            await api.keys.retire(fleet.root, RetireKeyInput(kind="ca", id=old_ca, force=True))
            await api.keys.retire(fleet.root, RetireKeyInput(kind="instructions", id=old_signer, force=True))
            await api.keys.retire(fleet.root, RetireKeyInput(kind="join", id=old_join))
            await anyio.sleep(5)  # reservations go on being made after the retires
            stop.set()

        # A token sealed to the retired JoinService key is refused as unopenable.
        key = NodeKey()
        hardware = claims("SN-LOAD-STALE")
        csr_pem = key.csr_pem()
        stale = seal_token(
            old_join_key, stale_token.token, binding=join_binding(csr_pem, hardware), now=fleet.clock.now()
        )
        with pytest.raises(UnauthenticatedError) as refused:
            await fleet.services.join(sealed_token=stale, csr_pem=csr_pem, claims=hardware)
        assert refused.value.details["reason"] == "unopenable"

        # Nothing was lost: every reservation made gets to active, every node is in session, none refused anything.
        assert len(made) >= 10
        for reservation_id in made:
            await settle_reservation(gw, reservation_id, "active", seconds=60)

        async def twenty_in_session() -> bool:  # the node that joined late has stopped
            return all(n.id in gw.gateway.sessions for n in nodes)

        await wait_for(twenty_in_session, seconds=60)
        assert set((await _issuers(gw)).values()) == {new_ca}
        refused_events = [
            p["payload"]
            for _, p in await fleet.events("node.reported")
            if p["type"] in ("desired_state.refused", "command.refused")
        ]
        assert refused_events == []
        code, _, stderr = await fleet_sim.stop()
        assert code == 0, stderr
