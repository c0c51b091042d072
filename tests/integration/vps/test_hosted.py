"""Hosted pools through the control plane: admission and placement on ``compute-instance``, the instances in their
node's desired state, the daemon's reports, the lifecycle after a node is lost, bad input. The VM itself is proven
by ``test_hosted_vm.py`` (a real ``bcd node`` running QEMU)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import anyio
import pytest

from bettercompute.errors import (
    AccessDeniedError,
    ComputeError,
    FailedPreconditionError,
    InvalidInputError,
    NoCapacityError,
    NotFoundError,
    QuotaExceededError,
)
from bettercompute.modules.nodes import NODES
from bettercompute_vps._schemas import (
    ConfigureVpsPoolInput,
    CreateInstanceInput,
    InstanceInput,
    ListInstancesInput,
    ResizeInput,
    Size,
    TunnelInput,
    UsageInput,
)

from ..joins.conftest import Fleet
from .conftest import Host, Vps

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq0aTx0dGVzdGtleWZvcmJldHRlcmNvbXB1dGU= alice@laptop"


@pytest.fixture
def vps(fleet: Fleet) -> Vps:
    return Vps(fleet=fleet)


def _create(vps: Vps, pool: str, image: str, name: str = "web-1", **size: int) -> CreateInstanceInput:
    wanted = {"vcpu": 2, "memory_mib": 2048, "disk_gib": 10, **size}
    return CreateInstanceInput(
        tenant=vps.fleet.acme,
        pool_id=pool,
        name=name,
        size=Size(**wanted),
        image_id=image,
        ssh_authorized_keys=(KEY,),
        user_data="#cloud-config\npackages: [htop]\n",
    )


async def _instance(vps: Vps, instance_id: str) -> Any:
    return await vps.groups.instances.get(vps.fleet.alice, InstanceInput(id=instance_id))


def _entry(desired: dict[str, Any], instance_id: str) -> dict[str, Any] | None:
    return next((e for e in desired.get("instances", []) if e["id"] == instance_id), None)


async def test_an_instance_is_placed_runs_stops_and_is_deleted_through_its_node(vps: Vps) -> None:
    pool = await vps.fleet.new_pool("vms", "vps-host")
    image = await vps.image()
    host = await vps.host(pool, "SN-A")
    instances = vps.groups.instances

    created = await instances.create(vps.fleet.alice, _create(vps, pool, image))
    assert created.state == "pending" and created.node_id == host.node_id
    await vps.tick()
    entry = _entry(await vps.desired(host.node_id), created.id)
    assert entry is not None
    assert entry["power"] == "running" and entry["vcpu"] == 2 and entry["hostname"] == "web-1"
    assert entry["ssh_authorized_keys"] == [KEY] and entry["image"]["sha256"] == "b" * 64
    assert (await _instance(vps, created.id)).state == "provisioning"

    # The daemon reports it running, with its address and console; an old spec's report changes no state.
    await vps.report(host, [{"id": created.id, "spec": 0, "state": "failed", "reason": "VM_CRASHED"}])
    assert (await _instance(vps, created.id)).state == "provisioning"
    console = "Booting...\nhostname: web-1\n"
    await vps.report(
        host,
        [
            {
                "id": created.id,
                "spec": entry["spec"],
                "state": "running",
                "addresses": ["10.213.0.2"],
                "console": console,
            }
        ],
    )
    running = await _instance(vps, created.id)
    assert running.state == "running" and running.addresses == ("10.213.0.2",) and running.step is None
    shown = await instances.console(vps.fleet.alice, InstanceInput(id=created.id))
    assert "hostname: web-1" in shown.text

    stopped = await instances.stop(vps.fleet.alice, InstanceInput(id=created.id))
    assert stopped.power == "stopped" and stopped.state == "running"  # desired changed; it converges later
    await vps.tick()
    entry = _entry(await vps.desired(host.node_id), created.id)
    assert entry is not None and entry["power"] == "stopped"
    await vps.report(host, [{"id": created.id, "spec": entry["spec"], "state": "stopped"}])
    assert (await _instance(vps, created.id)).state == "stopped"

    vps.fleet.clock.advance(dt.timedelta(hours=2))
    await instances.delete(vps.fleet.alice, InstanceInput(id=created.id))
    await vps.tick()
    assert _entry(await vps.desired(host.node_id), created.id) is None
    await vps.report(host, [])  # the daemon no longer runs it
    gone = await _instance(vps, created.id)
    assert gone.state == "deleted" and gone.deleted_at is not None

    # Its booking is usage: 2 vCPUs, 2 GiB and 10 GiB of disk for the two hours and some seconds it lived; a
    # window over its second hour only counts that hour.
    start = created.created_at
    usage = await instances.usage(
        vps.fleet.alice, UsageInput(tenant=vps.fleet.acme, start=start, end=start + dt.timedelta(days=1))
    )
    (used,) = usage.pools
    assert used.pool_id == pool and used.gpu_hours == 0
    assert used.vcpu_hours == pytest.approx(4.0, abs=0.05) and used.disk_gib_hours == pytest.approx(20.0, abs=0.5)
    hour = await instances.usage(
        vps.fleet.alice,
        UsageInput(tenant=vps.fleet.acme, start=start + dt.timedelta(hours=1), end=start + dt.timedelta(hours=2)),
    )
    assert hour.pools[0].vcpu_hours == pytest.approx(2.0) and hour.pools[0].memory_gib_hours == pytest.approx(2.0)
    with pytest.raises(InvalidInputError):
        await instances.usage(vps.fleet.alice, UsageInput(tenant=vps.fleet.acme, start=start, end=start))


async def test_placement_refuses_what_does_not_fit_and_says_why(vps: Vps) -> None:
    pool = await vps.fleet.new_pool("vms", "vps-host")
    image = await vps.image()
    await vps.host(pool, "SN-A", vcpu=4, memory_mib=8192, disk_gib=40)
    instances = vps.groups.instances

    with pytest.raises(NoCapacityError) as too_big:
        await instances.create(vps.fleet.alice, _create(vps, pool, image, vcpu=8))
    assert too_big.value.details["reason"] == "larger_than_any_node"
    assert too_big.value.details["excluded"] == {"vcpu": 1}

    await instances.create(vps.fleet.alice, _create(vps, pool, image, name="a", vcpu=3))
    with pytest.raises(NoCapacityError) as full:
        await instances.create(vps.fleet.alice, _create(vps, pool, image, name="b", vcpu=2))
    assert full.value.details["reason"] == "pool_full" and full.value.details["excluded"] == {"vcpu": 1}

    # Overcommit only when the pool says so.
    await vps.groups.vps_pools.configure(vps.fleet.alice, ConfigureVpsPoolInput(pool_id=pool, cpu_ratio=2.0))
    placed = await instances.create(vps.fleet.alice, _create(vps, pool, image, name="b", vcpu=2))
    assert placed.node_id is not None


async def test_a_host_offers_only_what_its_node_signed(vps: Vps) -> None:
    # A vm section the inventory controller refused (a gateway that turned made it up) offers nothing: the pool is
    # as empty as with no host at all.
    pool = await vps.fleet.new_pool("vms", "vps-host")
    image = await vps.image()
    host = await vps.host(pool, "SN-SIGNED", vcpu=4, memory_mib=8192, disk_gib=40)
    offer = {"vcpu": 64, "memory_mib": 524288, "disk_gib": 4000, "gpus": []}
    async with vps.fleet.store.transaction() as tx:
        await tx.repository(NODES).record_inventory(host.node_id, "vm", offer, fake=True)
    [section] = [r for r in await vps.fleet.store.repository(NODES).inventory(host.node_id) if r.section == "vm"]
    assert await vps.fleet.store.repository(NODES).check_inventory(
        host.node_id, "vm", received_at=section.received_at, verdict="unsigned"
    )
    await vps.tick()
    with pytest.raises(NoCapacityError):
        await vps.groups.instances.create(vps.fleet.alice, _create(vps, pool, image, vcpu=1))


async def test_a_burst_of_creates_never_overcommits_a_node(vps: Vps) -> None:
    pool = await vps.fleet.new_pool("vms", "vps-host")
    image = await vps.image()
    await vps.host(pool, "SN-A", vcpu=4, memory_mib=65536, disk_gib=1000)
    await vps.host(pool, "SN-B", vcpu=4, memory_mib=65536, disk_gib=1000)
    outcomes: list[str] = []

    async def one(i: int) -> None:
        try:
            await vps.groups.instances.create(vps.fleet.alice, _create(vps, pool, image, name=f"n{i}", vcpu=1))
            outcomes.append("placed")
        except NoCapacityError:
            outcomes.append("no_capacity")

    async with anyio.create_task_group() as tg:
        for i in range(24):
            tg.start_soon(one, i)
    assert outcomes.count("placed") == 8 and outcomes.count("no_capacity") == 16
    rows = await vps.fleet.store.fetch(
        vps.fleet.store.sql(
            "SELECT node_id, sum(vcpu) AS used FROM {s}.vps_instances WHERE deleted_at IS NULL GROUP BY node_id"
        ),
        {},
    )
    assert sorted(int(r.used) for r in rows) == [4, 4]


async def test_bad_input_is_refused_with_nothing_written(vps: Vps) -> None:
    pool = await vps.fleet.new_pool("vms", "vps-host")
    gpu_pool = vps.fleet.pool
    image = await vps.image(min_disk_gib=20)
    await vps.host(pool, "SN-A")
    instances = vps.groups.instances
    alice = vps.fleet.alice

    with pytest.raises(NotFoundError) as unknown:
        await instances.create(alice, _create(vps, pool, "img_nosuchimage", disk_gib=30))
    assert unknown.value.details["path"] == "image_id"
    with pytest.raises(InvalidInputError) as small:
        await instances.create(alice, _create(vps, pool, image, disk_gib=10))
    assert small.value.details["path"] == "size.disk_gib"
    with pytest.raises(InvalidInputError) as wrong_pool:
        await instances.create(alice, _create(vps, gpu_pool, image, disk_gib=30))
    assert wrong_pool.value.details["path"] == "pool_id"
    base = {
        "tenant": vps.fleet.acme,
        "pool_id": pool,
        "name": "big",
        "size": {"vcpu": 1, "memory_mib": 512, "disk_gib": 30},
        "image_id": image,
    }
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"user_data": "x" * (16 * 1024 + 1)}, "user_data"),
        ({"user_data": "é" * (8 * 1024 + 1)}, "user_data"),  # 8193 code points, 16386 bytes
        ({"user_data": "a\x00b"}, "user_data"),
        ({"user_data": "\ud800"}, "user_data"),
        ({"ssh_authorized_keys": ["ssh-ed25519 AAAAAAAAAAAAAAAAAAAA\nssh-rsa AAAA"]}, "ssh_authorized_keys"),
        ({"ssh_authorized_keys": ["not a key"]}, "ssh_authorized_keys"),
        ({"ssh_authorized_keys": ["ssh-ed25519 AAAAAAAAAAAAAAAAAAAA \u202ecomment"]}, "ssh_authorized_keys"),
        ({"name": "Web\u0661"}, "name"),
        ({"size": {"vcpu": 0, "memory_mib": 512, "disk_gib": 30}}, "size.vcpu"),
        ({"size": {"vcpu": 1, "memory_mib": 512, "disk_gib": 30, "gpus": -1}}, "size.gpus"),
        ({"ports": [0]}, "ports"),
        ({"ports": [22, 22]}, "ports"),
    ]
    for change, path in refusals:
        response = await vps.fleet.http.post(
            "/api/compute/instances/create",
            headers={"authorization": f"Bearer {alice}", "content-type": "application/json"},
            content=json.dumps({**base, **change}).encode(),  # ASCII: a lone surrogate travels as its escape
        )
        assert response.status_code == 400, (change, response.text)
        error = response.json()["error"]
        assert error["code"] == "INVALID_INPUT" and error["details"]["path"].startswith(path), (change, error)
        assert "xxxxxxxx" not in response.text and "éééé" not in response.text
    listed = await instances.list(alice, ListInstancesInput(tenant=vps.fleet.acme))
    assert listed.instances == ()

    created = await instances.create(alice, _create(vps, pool, image, disk_gib=30))
    with pytest.raises(InvalidInputError) as shrink:
        await instances.resize(alice, ResizeInput(id=created.id, size=Size(vcpu=2, memory_mib=2048, disk_gib=29)))
    assert shrink.value.details["path"] == "size.disk_gib"
    grown = await instances.resize(alice, ResizeInput(id=created.id, size=Size(vcpu=3, memory_mib=4096, disk_gib=40)))
    assert grown.size.vcpu == 3 and grown.size.disk_gib == 40
    with pytest.raises(NoCapacityError):
        await instances.resize(alice, ResizeInput(id=created.id, size=Size(vcpu=5, memory_mib=4096, disk_gib=40)))


async def test_quota_and_tenants(vps: Vps) -> None:
    pool = await vps.fleet.new_pool("vms", "vps-host")
    image = await vps.image()
    await vps.host(pool, "SN-A", vcpu=16, memory_mib=65536)
    await vps.groups.vps_pools.configure(vps.fleet.alice, ConfigureVpsPoolInput(pool_id=pool, max_vcpu=3))
    instances = vps.groups.instances
    created = await instances.create(vps.fleet.alice, _create(vps, pool, image, name="a", vcpu=2))
    with pytest.raises(QuotaExceededError) as over:
        await instances.create(vps.fleet.alice, _create(vps, pool, image, name="b", vcpu=2))
    assert over.value.details["limit"] == "max_vcpu"
    # Another tenant's caller sees nothing of it and changes nothing.
    with pytest.raises((AccessDeniedError, NotFoundError)):
        await instances.get(vps.fleet.mallory, InstanceInput(id=created.id))
    with pytest.raises((AccessDeniedError, NotFoundError)):
        await instances.delete(vps.fleet.mallory, InstanceInput(id=created.id))
    with pytest.raises(AccessDeniedError):
        await instances.create(vps.fleet.mallory, _create(vps, pool, image, name="m"))


async def test_a_node_reports_only_its_own_instances(vps: Vps) -> None:
    pool = await vps.fleet.new_pool("vms", "vps-host")
    image = await vps.image()
    a = await vps.host(pool, "SN-A", vcpu=2)
    b = await vps.host(pool, "SN-B", vcpu=2)
    created = await vps.groups.instances.create(vps.fleet.alice, _create(vps, pool, image))
    other = b if created.node_id == a.node_id else a
    await vps.report(other, [{"id": created.id, "spec": 1, "state": "failed", "reason": "X", "console": "owned"}])
    seen = await _instance(vps, created.id)
    assert seen.state == "pending" and seen.reason is None
    shown = await vps.groups.instances.console(vps.fleet.alice, InstanceInput(id=created.id))
    assert shown.text == ""
    with pytest.raises(ComputeError):
        await vps.report(other, "not a list")  # type: ignore[arg-type]


async def test_an_instance_on_a_lost_node_says_why(vps: Vps) -> None:
    pool = await vps.fleet.new_pool("vms", "vps-host")
    image = await vps.image()
    host: Host = await vps.host(pool, "SN-A")
    created = await vps.groups.instances.create(vps.fleet.alice, _create(vps, pool, image))
    await vps.set_node_state(host.node_id, "unreachable")
    await vps.tick()
    seen = await _instance(vps, created.id)
    assert seen.reason == "NODE_UNREACHABLE" and seen.state != "failed"
    await vps.set_node_state(host.node_id, "failed")
    await vps.tick()
    seen = await _instance(vps, created.id)
    assert seen.state == "failed" and seen.reason == "NODE_FAILED" and seen.node_id is None
    with pytest.raises(NoCapacityError) as nowhere:
        await vps.groups.instances.create(vps.fleet.alice, _create(vps, pool, image, name="web-2"))
    assert nowhere.value.details["reason"] == "no_available_node"
    assert nowhere.value.details["excluded"] == {"node_failed": 1}
    with pytest.raises(FailedPreconditionError):
        await vps.groups.instances.reboot(vps.fleet.alice, InstanceInput(id=created.id))
    deleted = await vps.groups.instances.delete(vps.fleet.alice, InstanceInput(id=created.id))
    assert deleted.state == "deleted"


async def test_a_tunnel_is_opened_only_to_an_exposed_port_of_a_running_instance_by_its_tenant(vps: Vps) -> None:
    pool = await vps.fleet.new_pool("vms", "vps-host")
    image = await vps.image()
    host = await vps.host(pool, "SN-A")
    instances = vps.groups.instances
    created = await instances.create(vps.fleet.alice, _create(vps, pool, image))
    with pytest.raises(FailedPreconditionError):  # not running yet
        await instances.tunnel(vps.fleet.alice, TunnelInput(id=created.id, port=22))
    await vps.tick()
    await vps.report(host, [{"id": created.id, "spec": 1, "state": "running"}])
    with pytest.raises(InvalidInputError) as port:
        await instances.tunnel(vps.fleet.alice, TunnelInput(id=created.id, port=8080))
    assert port.value.details["path"] == "port"
    with pytest.raises((AccessDeniedError, NotFoundError)):
        await instances.tunnel(vps.fleet.mallory, TunnelInput(id=created.id, port=22))
    opened = await instances.tunnel(vps.fleet.alice, TunnelInput(id=created.id, port=22))
    assert opened.ticket.startswith("bctt_") and opened.ca_pem.startswith("-----BEGIN CERTIFICATE-----")
    rows = await vps.fleet.store.fetch(
        vps.fleet.store.sql("SELECT node_id, host, port, resource_type FROM {s}.tunnels WHERE id = :id"),
        {"id": opened.tunnel_id},
    )
    assert [(r.node_id, r.host, r.port, r.resource_type) for r in rows] == [
        (host.node_id, f"instance:{created.id}", 22, "compute-instance")
    ]


async def test_one_nodes_poison_never_stops_the_others(vps: Vps) -> None:
    pool = await vps.fleet.new_pool("vms", "vps-host")
    image = await vps.image()
    first = await vps.host(pool, "SN-A", vcpu=2**31, memory_mib=2**62, disk_gib=-5)  # out of any column's range
    second = await vps.host(pool, "SN-B", vcpu=2)
    rows = await vps.fleet.store.fetch(
        vps.fleet.store.sql("SELECT node_id, vcpu, disk_gib FROM {s}.vps_hosts ORDER BY node_id"), {}
    )
    offered = {r.node_id: (r.vcpu, r.disk_gib) for r in rows}
    assert offered[second.node_id] == (2, 100) and offered[first.node_id] == (4096, 0)
    created = await vps.groups.instances.create(vps.fleet.alice, _create(vps, pool, image, disk_gib=10))
    assert created.node_id == second.node_id  # the first offers no disk at all
    # A node's report says where its instance is; never an address no tenant may use.
    await vps.tick()
    await vps.report(
        second,
        [{"id": created.id, "spec": 1, "state": "running", "addresses": ["127.0.0.1", "169.254.169.254", "10.1.2.3"]}],
    )
    assert (await _instance(vps, created.id)).addresses == ("10.1.2.3",)


async def test_a_timestamp_past_the_calendar_is_bad_input_not_a_crash(vps: Vps) -> None:
    response = await vps.fleet.http.post(
        "/api/compute/instances/usage",
        headers={"authorization": f"Bearer {vps.fleet.alice}"},
        json={"tenant": vps.fleet.acme, "start": "2030-01-01T00:00:00Z", "end": "9999-12-31T23:00:00-10:00"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["details"]["path"] == "end"
