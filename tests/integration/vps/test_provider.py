"""Provider pools through the control plane against moto's EC2 server (a real process on loopback): the workflow
launches, polls, records the provider's id and addresses, and stops, resizes, starts, reboots and terminates; a
throttled or lost launch is retried with its client token and makes exactly one VM; provider errors become the
instance's reason."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import attrs
import pytest

from bettercompute.errors import AccessDeniedError, InvalidInputError, NoCapacityError
from bettercompute.modules.images import RegisterImageInput
from bettercompute.modules.secrets import CreateSecretInput
from bettercompute_vps._schemas import (
    ConfigureVpsPoolInput,
    CreateInstanceInput,
    GetVpsPoolInput,
    InstanceInput,
    InstanceType,
    ProviderInput,
    ResizeInput,
    Size,
)

from ..joins.conftest import Fleet
from ._moto import ACCESS_KEY_ID, SECRET_ACCESS_KEY, MotoServer
from .conftest import Vps
from .test_ec2 import faulty_proxy

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

TYPES = (
    InstanceType(name="t3.micro", vcpu=2, memory_mib=1024),
    InstanceType(name="t3.large", vcpu=2, memory_mib=8192),
    InstanceType(name="m5.xlarge", vcpu=4, memory_mib=16384),
)


@pytest.fixture
def vps(fleet: Fleet) -> Vps:
    return Vps(fleet=fleet)


async def _pool(vps: Vps, endpoint: str, ami: str | None) -> tuple[str, str]:
    """A configured provider pool on ``endpoint`` and a disk image carrying ``ami``: (pool id, image id)."""
    fleet = vps.fleet
    pool = await fleet.new_pool("cloud", "provider")
    await fleet.compute.api.secrets.create(
        fleet.alice,
        CreateSecretInput(
            tenant=fleet.acme,
            name="ec2-keys",
            scope=f"pool:{pool}",
            value=json.dumps({"access_key_id": ACCESS_KEY_ID, "secret_access_key": SECRET_ACCESS_KEY}),
        ),
    )
    await vps.groups.vps_pools.configure(
        fleet.root,  # an endpoint_url is an operator's setting
        ConfigureVpsPoolInput(
            pool_id=pool,
            provider=ProviderInput(
                kind="ec2",
                region="us-east-1",
                credentials_secret="ec2-keys",
                instance_types=TYPES,
                endpoint_url=endpoint,
            ),
        ),
    )
    image = await fleet.compute.api.images.register(
        fleet.alice,
        RegisterImageInput(
            tenant=fleet.acme,
            name="ubuntu",
            kind="disk",
            url="https://images.example.test/ubuntu.img",
            sha256="c" * 64,
            provider_images={"ec2": ami or "ami-00000000000000000"},
        ),
    )
    return pool, image.id


def _input(vps: Vps, pool: str, image: str, **size: int) -> CreateInstanceInput:
    return CreateInstanceInput(
        tenant=vps.fleet.acme,
        pool_id=pool,
        name="api-1",
        size=Size(**{"vcpu": 2, "memory_mib": 1024, "disk_gib": 8, **size}),
        image_id=image,
        user_data="#cloud-config\npackages: [nginx]\n",
    )


async def _until(vps: Vps, instance_id: str, states: set[str], *, passes: int = 60) -> Any:
    """Run the workers' passes (3 s apart on the manual clock) until the instance is in one of ``states``."""
    seen: list[tuple[str, str | None, str | None]] = []
    for _ in range(passes):
        instance = await vps.groups.instances.get(vps.fleet.alice, InstanceInput(id=instance_id))
        seen.append((instance.state, instance.step, instance.reason))
        if instance.state in states:
            return instance
        vps.fleet.clock.advance(dt.timedelta(seconds=3))
        await vps.fleet.compute.jobs.tick()
    raise AssertionError(f"never {states}: {seen[-10:]}")


def _described(server: MotoServer, provider_id: str) -> dict[str, Any]:
    client = server.ec2_client()
    try:
        (reservation,) = client.describe_instances(InstanceIds=[provider_id])["Reservations"]
        found: dict[str, Any] = dict(reservation["Instances"][0])
        return found
    finally:
        client.close()


async def test_an_instance_at_the_provider_launches_stops_resizes_reboots_and_terminates(
    vps: Vps, moto_ec2: str, moto_ami: str, moto_ec2_server: MotoServer
) -> None:
    pool, image = await _pool(vps, moto_ec2, moto_ami)
    instances = vps.groups.instances
    alice = vps.fleet.alice
    created = await instances.create(alice, _input(vps, pool, image))
    assert created.instance_type == "t3.micro" and created.node_id is None and created.pool_class == "provider"

    running = await _until(vps, created.id, {"running", "failed"})
    assert running.state == "running", running
    assert running.provider_id is not None and running.addresses
    seen = _described(moto_ec2_server, running.provider_id)
    assert seen["InstanceType"] == "t3.micro"
    tags = {t["Key"]: t["Value"] for t in seen.get("Tags", [])}
    assert tags["bettercompute:instance"] == created.id
    assert moto_ec2_server.instance_count() == 1

    await instances.stop(alice, InstanceInput(id=created.id))
    stopped = await _until(vps, created.id, {"stopped", "failed"})
    assert stopped.state == "stopped" and _described(moto_ec2_server, running.provider_id)["State"]["Name"] == "stopped"

    resized = await instances.resize(alice, ResizeInput(id=created.id, size=Size(vcpu=4, memory_mib=8192, disk_gib=8)))
    assert resized.instance_type == "m5.xlarge"
    await _until(vps, created.id, {"stopped", "failed"})
    await instances.start(alice, InstanceInput(id=created.id))
    started = await _until(vps, created.id, {"running", "failed"})
    assert started.state == "running"
    assert _described(moto_ec2_server, running.provider_id)["InstanceType"] == "m5.xlarge"

    await instances.reboot(alice, InstanceInput(id=created.id))
    assert (await _until(vps, created.id, {"running", "failed"})).state == "running"

    await instances.delete(alice, InstanceInput(id=created.id))
    deleted = await _until(vps, created.id, {"deleted", "failed"})
    assert deleted.state == "deleted"
    assert _described(moto_ec2_server, running.provider_id)["State"]["Name"] == "terminated"
    assert moto_ec2_server.instance_count() == 1  # one VM in its whole life


@pytest.mark.parametrize("fault", ["throttle", "drop"])
async def test_a_throttled_or_lost_launch_is_retried_into_exactly_one_vm(
    vps: Vps, moto_ec2: str, moto_ami: str, moto_ec2_server: MotoServer, fault: Any
) -> None:
    async with faulty_proxy(moto_ec2, fault) as (url, proxy):
        pool, image = await _pool(vps, url, moto_ami)
        created = await vps.groups.instances.create(vps.fleet.alice, _input(vps, pool, image))
        reasons: set[str | None] = set()
        for _ in range(40):
            vps.fleet.clock.advance(dt.timedelta(seconds=3))
            await vps.fleet.compute.jobs.tick()
            instance = await vps.groups.instances.get(vps.fleet.alice, InstanceInput(id=created.id))
            reasons.add(instance.reason)
            if instance.state in ("running", "failed"):
                break
        assert instance.state == "running", instance
        assert {"throttle": "PROVIDER_THROTTLED", "drop": "PROVIDER_UNAVAILABLE"}[fault] in reasons
        assert proxy.run_instances_seen >= 1
        assert moto_ec2_server.instance_count() == 1


async def test_provider_errors_become_the_instances_reason(vps: Vps, moto_ec2: str) -> None:
    pool, image = await _pool(vps, moto_ec2, None)  # an image id the provider does not know
    created = await vps.groups.instances.create(vps.fleet.alice, _input(vps, pool, image))
    failed = await _until(vps, created.id, {"failed", "running"})
    assert failed.state == "failed" and failed.reason == "PROVIDER_IMAGE_NOT_FOUND", failed

    with pytest.raises(NoCapacityError) as too_big:
        await vps.groups.instances.create(vps.fleet.alice, _input(vps, pool, image, vcpu=64))
    assert too_big.value.details["reason"] == "no_instance_type"
    # User data the provider could not be given is refused at once, not found out at the launch.
    with pytest.raises(InvalidInputError) as unknown_kind:
        await vps.groups.instances.create(
            vps.fleet.alice, attrs.evolve(_input(vps, pool, image), name="api-2", user_data="hello")
        )
    assert unknown_kind.value.details["path"] == "user_data"


async def test_a_provider_pool_is_configured_with_a_secret_of_its_own(vps: Vps, moto_ec2: str) -> None:
    fleet = vps.fleet
    pool = await fleet.new_pool("cloud", "provider")
    provider = ProviderInput(kind="ec2", region="us-east-1", credentials_secret="nope", instance_types=TYPES)
    with pytest.raises(InvalidInputError) as unknown:
        await vps.groups.vps_pools.configure(fleet.alice, ConfigureVpsPoolInput(pool_id=pool, provider=provider))
    assert unknown.value.details["path"] == "provider.credentials_secret"
    with pytest.raises(InvalidInputError) as missing:
        await vps.groups.vps_pools.configure(fleet.alice, ConfigureVpsPoolInput(pool_id=pool))
    assert missing.value.details["path"] == "provider"
    # The workers would call an endpoint from inside the control plane's network: a tenant may not set one.
    await fleet.compute.api.secrets.create(
        fleet.alice, CreateSecretInput(tenant=fleet.acme, name="keys", scope=f"pool:{pool}", value="{}")
    )
    internal = attrs.evolve(provider, credentials_secret="keys", endpoint_url="http://169.254.169.254/latest")
    with pytest.raises(AccessDeniedError) as tenant_endpoint:
        await vps.groups.vps_pools.configure(fleet.alice, ConfigureVpsPoolInput(pool_id=pool, provider=internal))
    assert tenant_endpoint.value.details["path"] == "provider.endpoint_url"
    with pytest.raises(InvalidInputError) as with_user:
        await vps.groups.vps_pools.configure(
            fleet.root,
            ConfigureVpsPoolInput(pool_id=pool, provider=attrs.evolve(internal, endpoint_url="http://u:p@h.example")),
        )
    assert with_user.value.details["path"].startswith("provider.")
    shown = await vps.groups.vps_pools.get(fleet.alice, GetVpsPoolInput(pool_id=pool))
    assert shown.provider is None
