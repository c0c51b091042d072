"""Enroll -> inspect -> commission -> ready against a real Redfish emulator, with the site's and the ramdisk's gateway
methods called as their agents call them (``compute.gateway_services.call``, what the gateway's ``Call`` relays).

The agents' keys, CSRs and signatures are the daemon's own (``bettercompute_daemon.identity``); the boot itself (DHCP,
TFTP, HTTP, QEMU) is proven in ``tests/integration/site``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import shlex
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from bettercompute import BetterCompute, JoinSettings, LocalKeyKms
from bettercompute.errors import AccessDeniedError, ComputeError, UnauthenticatedError
from bettercompute.modules.images import RegisterImageInput
from bettercompute.modules.nodes import JOIN_KEYS
from bettercompute.modules.pools import CreatePoolInput
from bettercompute_daemon.identity import NodeKey, join_binding, seal_token
from bettercompute_metal import MetalGroups, MetalModule, report_message, verify_reports
from bettercompute_metal._redfish import RedfishClient
from bettercompute_metal._redfish_trust import BmcCredentials, BmcTls
from bettercompute_metal._schemas import (
    BmcInput,
    CreateSiteInput,
    CreateSiteTokenInput,
    DeployInput,
    EnrollInput,
    MachineInput,
)
from bettercompute_store_pg import PgStore
from tests._timing import deadline

from ..iam.conftest import two_tenants
from ._bmc import Bmc

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

TRUST_DOMAIN = "metal.example.test"
HEALTHY = {"healthy": True, "ecc_uncorrectable": 0, "xid": [], "retired_pages_pending": False}
SHA = "a" * 64


@attrs.frozen(kw_only=True)
class Plane:
    compute: BetterCompute
    store: PgStore
    alice: str
    mallory: str
    acme: str
    pool: str

    @property
    def metal(self) -> Any:
        return MetalGroups(self.compute.api)

    async def call(self, method: str, certificate_pem: str | None, input: dict[str, Any]) -> Any:
        return await self.compute.gateway_services.call(method, certificate_pem=certificate_pem, input=input)

    async def until(self, machine_id: str, states: set[str], within: float = 90.0) -> Any:
        """Run the workers' passes until the machine reaches one of ``states``."""
        ends = time.monotonic() + deadline(within)
        while True:
            await self.compute.jobs.tick()
            machine = await self.metal.metal.get(self.alice, MachineInput(id=machine_id))
            if machine.state in states:
                return machine
            assert time.monotonic() < ends, f"machine stuck in {machine.state} at {machine.step}: {machine.reason}"
            await _sleep(0.5)


async def _sleep(seconds: float) -> None:
    await anyio.sleep(seconds)


@pytest.fixture
async def plane(database_url: str, fresh_schema: str, tmp_path: Path) -> AsyncIterator[Plane]:
    join = JoinSettings(gateway_address="gw.metal.test:7443", trust_domain=TRUST_DOMAIN)
    kms = LocalKeyKms(tmp_path / "kms.key")
    async with two_tenants(database_url, fresh_schema, kms=kms, join=join, modules=[MetalModule()]) as t:
        pool = await t.compute.api.pools.create(t.alice, CreatePoolInput(tenant=t.acme, name="metal"))
        yield Plane(compute=t.compute, store=t.store, alice=t.alice, mallory=t.mallory, acme=t.acme, pool=pool.id)


async def _site(plane: Plane) -> tuple[str, str, NodeKey]:
    """A site with ramdisk images, joined: (site id, its certificate, its key)."""
    metal = plane.metal
    kernel = await plane.compute.api.images.register(
        plane.alice,
        RegisterImageInput(tenant=plane.acme, name="rd-kernel", kind="kernel", url="http://10.0.0.1/k", sha256=SHA),
    )
    initrd = await plane.compute.api.images.register(
        plane.alice,
        RegisterImageInput(tenant=plane.acme, name="rd-initrd", kind="initrd", url="http://10.0.0.1/i", sha256=SHA),
    )
    site = await metal.sites.create(
        plane.alice,
        CreateSiteInput(
            tenant=plane.acme, pool_id=plane.pool, name="rack-1", ramdisk_kernel=kernel.id, ramdisk_initrd=initrd.id
        ),
    )
    token = await metal.site_tokens.create(plane.alice, CreateSiteTokenInput(site_id=site.id))
    key = NodeKey()
    joined = await plane.call("site.join", None, {"token": token.token, "csr_pem": key.csr_pem()})
    assert joined["site_id"] == site.id
    # Single use: the same token again is refused, without saying why.
    with pytest.raises(UnauthenticatedError):
        await plane.call("site.join", None, {"token": token.token, "csr_pem": NodeKey().csr_pem()})
    return site.id, joined["certificate_pem"], key


def _signed(key: NodeKey, machine_id: str, task: dict[str, Any], ok: bool, result: dict[str, Any]) -> dict[str, Any]:
    signed_at_ms = int(time.time() * 1000)
    message = report_message(
        machine_id=machine_id,
        task_id=task["task_id"],
        kind=task["kind"],
        ok=ok,
        result=result,
        error=None,
        signed_at_ms=signed_at_ms,
    )
    signature = key.private_key.sign(message, ec.ECDSA(hashes.SHA256()))
    return {
        "task_id": task["task_id"],
        "kind": task["kind"],
        "ok": ok,
        "result": result,
        "error": None,
        "signed_at_ms": signed_at_ms,
        "signature": base64.b64encode(signature).decode(),
    }


async def _enrolled_and_inspected(plane: Plane, bmc: Bmc, site_id: str) -> Any:
    """Enroll the emulator's machine and run its inspection: the machine, inspected, its BMC password sealed."""
    machine = await plane.metal.metal.enroll(
        plane.alice,
        EnrollInput(
            site_id=site_id,
            bmc=BmcInput(url=bmc.url, username=bmc.username, password=bmc.password, pin_sha256=bmc.pin_sha256),
        ),
    )
    assert machine.state == "enrolled" and machine.step == "inspect"
    machine = await plane.until(machine.id, {"inspected", "failed"})
    assert machine.state == "inspected", machine
    assert machine.system_uuid == bmc.system_uuid.lower()
    assert set(machine.macs) == {m.lower() for m in bmc.macs}
    assert machine.bmc.credentials_ref == f"bmc/{machine.id}"
    assert bmc.password not in json.dumps(attrs.asdict(machine), default=str)
    return machine


async def _commissioned_to_the_ramdisk_step(plane: Plane, bmc: Bmc, machine_id: str, site_cert: str) -> Any:
    """Commission the machine: the workflow sets PXE once and powers it on, then waits for the ramdisk."""
    machine = await plane.metal.metal.commission(plane.alice, MachineInput(id=machine_id))
    assert machine.state == "commissioning"
    ends = time.monotonic() + deadline(90)
    while machine.step != "ramdisk":
        # The boot waits for the site's boot server to fetch the plan (with the new token) before powering on.
        await _tick_while_the_site_syncs(plane, site_cert)
        machine = await plane.metal.metal.get(plane.alice, MachineInput(id=machine.id))
        assert machine.state == "commissioning", machine
        assert time.monotonic() < ends, machine
        await _sleep(0.5)
    # What the BMC was told: boot from the network once (the power-on lands seconds later, asked for already).
    async with RedfishClient(
        bmc.url, BmcCredentials(bmc.username, bmc.password), BmcTls(pin_sha256=bmc.pin_sha256)
    ) as c:
        boot = (await c.inspect()).boot
    assert boot.override_target == "Pxe"  # (the emulator's fake driver keeps no "Once": it reports Continuous)
    return machine


async def _ramdisk_token_from_the_plan(plane: Plane, machine: Any, site_cert: str) -> str:
    """The active site agent's plan boots this machine into the ramdisk (a second agent stands by): its token."""
    sync = await plane.call("site.sync", site_cert, {"agent": "a-1", "http_base": "http://10.0.0.2:8080"})
    assert sync["active"] is True
    standby = await plane.call("site.sync", site_cert, {"agent": "a-2", "http_base": "http://10.0.0.3:8080"})
    assert standby["active"] is False and standby["holder"] == "a-1" and standby["plan"]["entries"] == []
    (entry,) = sync["plan"]["entries"]
    assert entry["machine_id"] == machine.id and entry["action"] == "ramdisk"
    assert set(entry["macs"]) == set(machine.macs)
    arguments = dict(part.split("=", 1) for part in shlex.split(entry["cmdline"]))
    assert arguments["bc.machine"] == machine.id and arguments["bc.gateway"] == "gw.metal.test:7443"
    return arguments["bc.token"]


async def _ramdisk_joined(plane: Plane, machine: Any, token: str) -> tuple[NodeKey, str]:
    """The ramdisk joins with the token and the machine's own UUID (no serial: the emulator reports none), once:
    its key and certificate."""
    ramdisk = NodeKey()
    wrong = {"token": token, "machine_id": machine.id, "csr_pem": ramdisk.csr_pem()}
    with pytest.raises(AccessDeniedError):
        await plane.call(
            "ramdisk.join", None, {**wrong, "claims": {"system_uuid": "0" * 8 + "-0000-0000-0000-" + "0" * 12}}
        )
    joined = await plane.call(
        "ramdisk.join", None, {**wrong, "claims": {"system_uuid": machine.system_uuid, "serial": machine.serial}}
    )
    not_after = dt.datetime.fromtimestamp(joined["not_after_ms"] / 1000, dt.UTC)
    assert not_after <= dt.datetime.now(dt.UTC) + dt.timedelta(hours=2, minutes=1)
    with pytest.raises(UnauthenticatedError):  # spent
        await plane.call(
            "ramdisk.join", None, {**wrong, "claims": {"system_uuid": machine.system_uuid, "serial": machine.serial}}
        )
    cert: str = joined["certificate_pem"]
    # A ramdisk certificate is not a site's.
    with pytest.raises(AccessDeniedError):
        await plane.call("site.sync", cert, {"agent": "x", "http_base": "http://x"})
    return ramdisk, cert


async def _ramdisk_diagnoses_and_wipes(plane: Plane, machine: Any, ramdisk: NodeKey, cert: str) -> None:
    """The ramdisk's tasks: diagnose (a forged report refused), then wipe its one disk; then nothing is left."""
    answer = await plane.call("ramdisk.task", cert, {"report": None})
    task = answer["task"]
    assert task["kind"] == "diagnose"
    disks = [{"name": "sda", "size_bytes": 1 << 30, "smart": {"supported": False, "passed": None}}]
    diagnosis = {"disks": disks, "claims": hardware(machine.system_uuid), "health": HEALTHY}
    forged = _signed(NodeKey(), machine.id, task, True, diagnosis)
    with pytest.raises(UnauthenticatedError):
        await plane.call("ramdisk.task", cert, {"report": forged})
    answer = await plane.call("ramdisk.task", cert, {"report": _signed(ramdisk, machine.id, task, True, diagnosis)})
    task = answer["task"]
    assert task["kind"] == "wipe" and task["params"] == {"disks": ["sda"]}
    wiped = {"disks": [{"name": "sda", "method": "zero", "ok": True}]}
    answer = await plane.call("ramdisk.task", cert, {"report": _signed(ramdisk, machine.id, task, True, wiped)})
    assert answer["task"] is None and answer["done"] is True


async def test_enroll_inspect_commission_to_ready(plane: Plane, bmc: Bmc) -> None:
    site_id, site_cert, _ = await _site(plane)
    machine = await _enrolled_and_inspected(plane, bmc, site_id)
    machine = await _commissioned_to_the_ramdisk_step(plane, bmc, machine.id, site_cert)
    token = await _ramdisk_token_from_the_plan(plane, machine, site_cert)
    ramdisk, cert = await _ramdisk_joined(plane, machine, token)
    await _ramdisk_diagnoses_and_wipes(plane, machine, ramdisk, cert)

    machine = await plane.until(machine.id, {"ready", "failed"})
    assert machine.state == "ready", machine
    assert machine.results["diagnose"]["disks"][0]["name"] == "sda"
    # The ramdisk's reports are kept as it signed them and check again later; a result changed in the database
    # (by anyone who can write there, a superuser say) no longer does.
    verdicts = await verify_reports(plane.store, machine.id)
    assert [(v.fact, v.id, v.verdict) for v in verdicts] == [
        ("ramdisk_report", "diagnose", "ok"),
        ("ramdisk_report", "wipe", "ok"),
    ]
    altered = plane.store.sql(
        "UPDATE {s}.metal_machines SET results = jsonb_set(results, '{diagnose,disks,0,name}', '\"sdz\"') "
        "WHERE id = :id RETURNING id"
    )
    assert await plane.store.fetch(altered, {"id": machine.id})
    verdicts = await verify_reports(plane.store, machine.id)
    assert [(v.id, v.verdict) for v in verdicts] == [("diagnose", "bad_signature"), ("wipe", "ok")]
    fixed = plane.store.sql(
        "UPDATE {s}.metal_machines SET results = jsonb_set(results, '{diagnose,disks,0,name}', '\"sda\"') "
        "WHERE id = :id RETURNING id"
    )
    assert await plane.store.fetch(fixed, {"id": machine.id})
    sync = await plane.call("site.sync", site_cert, {"agent": "a-1", "http_base": "http://10.0.0.2:8080"})
    assert sync["plan"]["entries"][0]["action"] == "local"

    await _deploy_and_rejoin(plane, machine.id, site_cert)


def hardware(system_uuid: str | None, serial: str = "EMU-0001") -> dict[str, Any]:
    """Hardware claims as the ramdisk and ``bcd join`` read them on the same machine."""
    return {"hostname": "metal-1", "serial": serial, "product": "Sushy Emulator", "system_uuid": system_uuid}


async def _ramdisk_session(plane: Plane, machine_id: str, site_cert: str) -> tuple[str, NodeKey, dict[str, Any]]:
    """The ramdisk of the machine's current boot, joined: (its certificate, its key, its first task)."""
    sync = await plane.call("site.sync", site_cert, {"agent": "a-1", "http_base": "http://10.0.0.2:8080"})
    (entry,) = [e for e in sync["plan"]["entries"] if e["machine_id"] == machine_id]
    assert entry["action"] == "ramdisk"
    arguments = dict(part.split("=", 1) for part in shlex.split(entry["cmdline"]))
    machine = await plane.metal.metal.get(plane.alice, MachineInput(id=machine_id))
    key = NodeKey()
    joined = await plane.call(
        "ramdisk.join",
        None,
        {
            "token": arguments["bc.token"],
            "machine_id": machine_id,
            "csr_pem": key.csr_pem(),
            "claims": {"system_uuid": machine.system_uuid, "serial": machine.serial},
        },
    )
    answer = await plane.call("ramdisk.task", joined["certificate_pem"], {"report": None})
    return joined["certificate_pem"], key, answer["task"]


async def _tick_while_the_site_syncs(plane: Plane, site_cert: str) -> None:
    """One pass of the workers while the site's active agent fetches its plan every 0.3 s, as ``bcd site run`` does:
    the boot step waits (within its pass) for the site to have fetched the plan it just prepared."""

    async def agent() -> None:
        while True:
            await plane.call("site.sync", site_cert, {"agent": "a-1", "http_base": "http://10.0.0.2:8080"})
            await anyio.sleep(0.3)

    async with anyio.create_task_group() as tg:
        tg.start_soon(agent)
        await plane.compute.jobs.tick()
        tg.cancel_scope.cancel()


async def _until_step(plane: Plane, machine_id: str, step: str, site_cert: str | None = None) -> Any:
    ends = time.monotonic() + deadline(90)
    while True:
        if site_cert is not None:
            await _tick_while_the_site_syncs(plane, site_cert)
        else:
            await plane.compute.jobs.tick()
        machine = await plane.metal.metal.get(plane.alice, MachineInput(id=machine_id))
        if machine.step == step:
            return machine
        assert machine.state != "failed" and time.monotonic() < ends, machine
        await _sleep(0.3)


async def _deploy_and_rejoin(plane: Plane, machine_id: str, site_cert: str) -> None:
    metal = plane.metal
    image = await plane.compute.api.images.register(
        plane.alice,
        RegisterImageInput(tenant=plane.acme, name="ubuntu", kind="disk", url="http://10.0.0.1/u.img", sha256=SHA),
    )
    with pytest.raises(ComputeError) as refused:
        await metal.metal.deploy(plane.alice, DeployInput(id=machine_id, image_id=image.id, disk="sdz"))
    assert refused.value.code == "INVALID_INPUT"
    machine = await metal.metal.deploy(plane.alice, DeployInput(id=machine_id, image_id=image.id))
    assert machine.state == "deploying" and machine.disk == "sda"
    await _until_step(plane, machine_id, "ramdisk", site_cert)
    cert, key, task = await _ramdisk_session(plane, machine_id, site_cert)
    assert task["kind"] == "diagnose"  # every boot diagnoses first
    disks = [{"name": "sda", "size_bytes": 1 << 30, "smart": {"supported": False, "passed": None}}]
    diagnosis = {"disks": disks, "claims": hardware(machine.system_uuid), "health": HEALTHY}
    answer = await plane.call("ramdisk.task", cert, {"report": _signed(key, machine_id, task, True, diagnosis)})
    task = answer["task"]
    assert task["kind"] == "deploy" and task["params"]["disk"] == "sda"
    assert task["params"]["image"]["sha256"] == SHA
    user_data = task["params"]["cloud_init"]["user_data"]
    assert user_data.startswith("#cloud-config\n")
    command = json.loads(user_data.split("\n", 1)[1])["runcmd"][0]
    token = command[command.index("--token") + 1]
    assert token.startswith("bcjt_")
    answer = await plane.call(
        "ramdisk.task",
        cert,
        {"report": _signed(key, machine_id, task, True, {"disk": "sda", "written_bytes": 1, "sha256": SHA})},
    )
    assert answer == {"task": None, "done": True, "reboot": True, "poll_after_ms": answer["poll_after_ms"]}
    machine = await _until_step(plane, machine_id, "join")

    # The installed system joins with the token from cloud-init: as the machine's node id, and only from its
    # own hardware, and only once.
    services = plane.compute.gateway_services
    join_key = await plane.store.repository(JOIN_KEYS).active()
    assert join_key is not None

    async def join(claims: dict[str, Any]) -> Any:
        node_key = NodeKey()
        csr_pem = node_key.csr_pem()
        sealed = seal_token(join_key.public_key, token, binding=join_binding(csr_pem, claims, None, None))
        return await services.join(sealed_token=sealed, csr_pem=csr_pem, claims=claims, evidence=None, pool_id=None)

    with pytest.raises(AccessDeniedError) as other:
        await join(hardware(machine.system_uuid, serial="OTHER-SERIAL"))
    assert other.value.details["reason"] == "expect_mismatch"
    result = await join(hardware(machine.system_uuid))
    assert result.node_id == machine.node_id
    with pytest.raises(UnauthenticatedError):
        await join(hardware(machine.system_uuid))
    machine = await _until_step(plane, machine_id, "adopt")
    assert machine.state == "deploying"


async def test_bad_credentials_fail_with_the_step_and_retry(plane: Plane, bmc: Bmc) -> None:
    site_id, _, _ = await _site(plane)
    metal = plane.metal
    machine = await metal.metal.enroll(
        plane.alice,
        EnrollInput(
            site_id=site_id,
            bmc=BmcInput(url=bmc.url, username=bmc.username, password="wrong-password", pin_sha256=bmc.pin_sha256),
        ),
    )
    machine = await plane.until(machine.id, {"inspected", "failed"})
    assert machine.state == "failed"
    assert machine.step == "inspect" and machine.reason == "BMC_AUTH_FAILED"
    again = await metal.metal.retry(plane.alice, MachineInput(id=machine.id))
    assert again.state == "enrolled" and again.step == "inspect"


async def test_unreachable_bmc_is_retried_visibly(plane: Plane, bmc: Bmc) -> None:
    site_id, _, _ = await _site(plane)
    machine = await plane.metal.metal.enroll(
        plane.alice,
        EnrollInput(
            site_id=site_id,
            bmc=BmcInput(url="https://127.0.0.1:9", username="admin", password="pw", pin_sha256=bmc.pin_sha256),
        ),
    )
    ends = time.monotonic() + deadline(30)
    while True:
        await plane.compute.jobs.tick()
        machine = await plane.metal.metal.get(plane.alice, MachineInput(id=machine.id))
        if machine.reason == "BMC_UNREACHABLE":
            break
        assert time.monotonic() < ends, machine
        await _sleep(0.2)
    assert machine.state == "enrolled" and machine.step == "inspect"


async def test_other_tenants_see_nothing(plane: Plane, bmc: Bmc) -> None:
    site_id, _, _ = await _site(plane)
    with pytest.raises(ComputeError) as refused:
        await plane.metal.metal.enroll(
            plane.mallory,
            EnrollInput(
                site_id=site_id,
                bmc=BmcInput(url=bmc.url, username=bmc.username, password=bmc.password, pin_sha256=bmc.pin_sha256),
            ),
        )
    assert refused.value.code in ("ACCESS_DENIED", "NOT_FOUND")


async def test_no_bmc_password_in_the_database(plane: Plane, bmc: Bmc) -> None:
    site_id, _, _ = await _site(plane)
    password = "S3cret-Passw0rd-for-leak-scan"
    await plane.metal.metal.enroll(
        plane.alice,
        EnrollInput(
            site_id=site_id,
            bmc=BmcInput(url=bmc.url, username=bmc.username, password=password, pin_sha256=bmc.pin_sha256),
        ),
    )
    schema = plane.store.schema
    tables = await plane.store.fetch(
        plane.store.sql("SELECT table_name FROM information_schema.tables WHERE table_schema = :s"), {"s": schema}
    )
    for table in tables:
        rows = await plane.store.fetch(
            plane.store.sql(f'SELECT t::text AS row FROM {{s}}."{table.table_name}" AS t'), {}
        )
        for row in rows:
            assert password not in row.row, table.table_name


async def _enrolled(plane: Plane, bmc: Bmc) -> tuple[str, str]:
    """A site joined and a machine of it inspected: (the machine's id, the site's certificate)."""
    site_id, site_cert, _ = await _site(plane)
    machine = await plane.metal.metal.enroll(
        plane.alice,
        EnrollInput(
            site_id=site_id,
            bmc=BmcInput(url=bmc.url, username=bmc.username, password=bmc.password, pin_sha256=bmc.pin_sha256),
        ),
    )
    inspected = await plane.until(machine.id, {"inspected", "failed"})
    assert inspected.state == "inspected", inspected
    return machine.id, site_cert


async def test_gpus_the_pool_refuses_fail_the_commissioning_with_the_reason(plane: Plane, bmc: Bmc) -> None:
    machine_id, site_cert = await _enrolled(plane, bmc)
    await plane.metal.metal.commission(plane.alice, MachineInput(id=machine_id))
    await _until_step(plane, machine_id, "ramdisk", site_cert)
    cert, key, task = await _ramdisk_session(plane, machine_id, site_cert)
    machine = await plane.metal.metal.get(plane.alice, MachineInput(id=machine_id))
    disks = [{"name": "sda", "size_bytes": 1 << 30, "smart": {"supported": True, "passed": True}}]
    sick = {**HEALTHY, "ecc_uncorrectable": 3, "xid": [79]}
    diagnosis = {"disks": disks, "claims": hardware(machine.system_uuid), "health": sick}
    # The same report twice (its answer lost the first time) is taken once.
    report = _signed(key, machine_id, task, True, diagnosis)
    first = await plane.call("ramdisk.task", cert, {"report": report})
    again = await plane.call("ramdisk.task", cert, {"report": report})
    assert first["done"] is True and again["done"] is True
    failed = await plane.until(machine_id, {"failed", "ready"})
    assert (failed.state, failed.step, failed.reason) == ("failed", "finish", "DIAGNOSE_FAILED")
    assert "ecc_uncorrectable" in (failed.message or "") and "xid_79" in (failed.message or "")


async def test_a_ramdisk_asking_again_gets_its_current_task_and_a_stale_report_is_refused(
    plane: Plane, bmc: Bmc
) -> None:
    machine_id, site_cert = await _enrolled(plane, bmc)
    await plane.metal.metal.commission(plane.alice, MachineInput(id=machine_id))
    await _until_step(plane, machine_id, "ramdisk", site_cert)
    cert, key, task = await _ramdisk_session(plane, machine_id, site_cert)
    assert (await plane.call("ramdisk.task", cert, {"report": None}))["task"] == task
    wrong = {**task, "task_id": task["task_id"] + "9"}
    with pytest.raises(ComputeError) as refused:
        await plane.call("ramdisk.task", cert, {"report": _signed(key, machine_id, wrong, True, {})})
    assert refused.value.code == "FAILED_PRECONDITION"
    bad: Any
    for bad in ([], "x", {"task_id": task["task_id"], "signed_at_ms": True}):
        with pytest.raises(ComputeError) as refused:
            await plane.call("ramdisk.task", cert, {"report": bad})
        assert refused.value.code in ("INVALID_INPUT", "UNAUTHENTICATED"), bad


async def test_a_wipe_that_misses_a_disk_fails_and_another_ramdisk_certificate_is_refused(
    plane: Plane, bmc: Bmc
) -> None:
    machine_id, site_cert = await _enrolled(plane, bmc)
    await plane.metal.metal.commission(plane.alice, MachineInput(id=machine_id))
    await _until_step(plane, machine_id, "ramdisk", site_cert)
    cert, key, task = await _ramdisk_session(plane, machine_id, site_cert)
    # A ramdisk certificate of the same machine that is not the one this boot's token was spent for.
    other_key = NodeKey()
    other = await plane.compute.gateway_services.joins.ca.issue(other_key.csr_pem(), node_id=machine_id, role="ramdisk")
    with pytest.raises(AccessDeniedError) as refused:
        await plane.call("ramdisk.task", other.certificate_pem, {"report": None})
    assert refused.value.details["reason"] == "not_current_ramdisk"
    machine = await plane.metal.metal.get(plane.alice, MachineInput(id=machine_id))
    disks = [
        {"name": name, "size_bytes": 1 << 30, "smart": {"supported": False, "passed": None}} for name in ("sda", "sdb")
    ]
    diagnosis = {"disks": disks, "claims": hardware(machine.system_uuid), "health": HEALTHY}
    answer = await plane.call("ramdisk.task", cert, {"report": _signed(key, machine_id, task, True, diagnosis)})
    wipe = answer["task"]
    assert wipe["params"] == {"disks": ["sda", "sdb"]}
    half = {"disks": [{"name": "sda", "method": "zero", "ok": True}]}
    assert (await plane.call("ramdisk.task", cert, {"report": _signed(key, machine_id, wipe, True, half)}))["done"]
    failed = await plane.until(machine_id, {"failed", "ready"})
    assert (failed.state, failed.reason) == ("failed", "WIPE_FAILED")


async def test_a_ramdisk_that_never_comes_fails_the_machine_at_the_wait_s_end(
    plane: Plane, bmc: Bmc, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bettercompute_metal import _workflows

    monkeypatch.setattr(_workflows, "RAMDISK_WAIT", dt.timedelta(seconds=1))
    machine_id, site_cert = await _enrolled(plane, bmc)
    await plane.metal.metal.commission(plane.alice, MachineInput(id=machine_id))
    await _until_step(plane, machine_id, "ramdisk", site_cert)
    await _sleep(1.5)
    failed = await plane.until(machine_id, {"failed", "ready"})
    assert (failed.state, failed.step, failed.reason) == ("failed", "finish", "RAMDISK_TIMEOUT")
    # Its boot is taken back: the site boots it from its disk again.
    sync = await plane.call("site.sync", site_cert, {"agent": "a-1", "http_base": "http://10.0.0.2:8080"})
    assert [e["action"] for e in sync["plan"]["entries"]] == ["local"]
    again = await plane.metal.metal.retry(plane.alice, MachineInput(id=machine_id))
    assert again.state == "commissioning"


async def test_malformed_boot_records_are_refused_and_records_name_only_the_site_s_machines(
    plane: Plane, bmc: Bmc
) -> None:
    machine_id, site_cert = await _enrolled(plane, bmc)
    bad: Any
    for bad in ([{"kind": ["dhcp"], "at_ms": 1}], [{"kind": "dhcp", "at_ms": True}], "x", [{}] * 501):
        with pytest.raises(ComputeError) as refused:
            await plane.call(
                "site.sync", site_cert, {"agent": "a-1", "http_base": "http://10.0.0.2:8080", "records": bad}
            )
        assert refused.value.code == "INVALID_INPUT", bad
    records = [
        {"kind": "dhcp", "at_ms": 1_700_000_000_000, "machine_id": ["x"], "mac": None, "detail": "offer"},
        {"kind": "file", "at_ms": 1_700_000_000_000, "machine_id": machine_id, "mac": None, "detail": "vmlinuz"},
        {"kind": "script", "at_ms": 1_700_000_000_000, "machine_id": "mch_of_another_site", "detail": "x"},
    ]
    await plane.call("site.sync", site_cert, {"agent": "a-1", "http_base": "http://10.0.0.2:8080", "records": records})
    machine = await plane.metal.metal.get(plane.alice, MachineInput(id=machine_id))
    assert [r["kind"] for r in machine.boot_records] == ["file"]
    with pytest.raises(ComputeError) as refused:
        await plane.call("site.sync", site_cert, {"agent": "a-1", "http_base": "ftp://x"})
    assert refused.value.code == "INVALID_INPUT"
