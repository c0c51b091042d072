"""Fixtures for the VPS tests.

- moto's EC2 server, one per test session, emptied before each test (tests elsewhere can import ``moto_ec2``,
  ``moto_ec2_server`` and ``moto_ami`` into their own conftest);
- a control plane with the VPS module, JoinService and a KMS (the joins fixtures, with ``modules`` overridden), and
  helpers that act as a node's daemon does: join, offer VM capacity, report instances through ``instances.report``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import attrs
import pytest

from bettercompute.modules.images import RegisterImageInput
from bettercompute.modules.nodes import NODES
from bettercompute_vps import Ec2Adapter, Ec2Credentials, Ec2Settings, VpsGroups, VpsModule

from ..cli.conftest import cli_env
from ..joins.conftest import Fleet, attestors, certificate_ttl, claims, clock, fleet, kms
from ._moto import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, MotoServer, start_moto

__all__ = ["Host", "Vps", "attestors", "certificate_ttl", "cli_env", "clock", "fleet", "kms", "modules"]


@pytest.fixture(scope="session")
def moto_ec2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """``moto_server`` on loopback for the whole session (image validation on, any credentials accepted)."""
    server = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def moto_ec2(moto_ec2_server: MotoServer) -> str:
    """The endpoint URL of an EC2 API with no instances (moto, reset before the test)."""
    moto_ec2_server.reset()
    return moto_ec2_server.url


@pytest.fixture
def moto_ami(moto_ec2: str, moto_ec2_server: MotoServer) -> str:
    """An image id that ``moto_ec2`` accepts for RunInstances."""
    return moto_ec2_server.usable_ami()


def ec2_adapter(
    endpoint_url: str, *, secret_access_key: str = SECRET_ACCESS_KEY, read_timeout: float = 30.0
) -> Ec2Adapter:
    """An ``Ec2Adapter`` for a moto endpoint with the tests' credentials."""
    return Ec2Adapter(
        Ec2Settings(region=REGION, endpoint_url=endpoint_url, connect_timeout=2.0, read_timeout=read_timeout),
        Ec2Credentials(access_key_id=ACCESS_KEY_ID, secret_access_key=secret_access_key),
    )


@pytest.fixture
async def ec2(moto_ec2: str) -> AsyncIterator[Ec2Adapter]:
    """An ``Ec2Adapter`` on ``moto_ec2``, closed after the test."""
    adapter = ec2_adapter(moto_ec2)
    try:
        yield adapter
    finally:
        await adapter.aclose()


SHA = "b" * 64


@pytest.fixture
def modules() -> Sequence[Any]:
    return [VpsModule()]


@attrs.frozen(kw_only=True)
class Host:
    """A node of a hosted pool, joined as ``bcd`` joins: its id and certificate."""

    node_id: str
    certificate_pem: str


@attrs.frozen(kw_only=True)
class Vps:
    fleet: Fleet

    @property
    def groups(self) -> Any:
        return VpsGroups(self.fleet.compute.api)

    async def image(self, name: str = "debian", **more: Any) -> str:
        registered = await self.fleet.compute.api.images.register(
            self.fleet.alice,
            RegisterImageInput(
                tenant=self.fleet.acme,
                name=name,
                kind="disk",
                url=f"https://images.example.test/{name}.img",
                sha256=SHA,
                size=1024,
                **more,
            ),
        )
        return str(registered.id)

    async def host(
        self, pool: str, serial: str, *, vcpu: int = 4, memory_mib: int = 8192, disk_gib: int = 100, gpus: int = 0
    ) -> Host:
        """Join a node to ``pool``, adopt it and have it offer VM capacity (its ``vm`` inventory section), as the
        gateway records it; then one pass of the host job."""
        token = await self.fleet.token(pool=pool)
        result, _ = await self.fleet.join(token.token, hardware=claims(serial))
        node_id = result.node_id
        offer = {
            "vcpu": vcpu,
            "memory_mib": memory_mib,
            "disk_gib": disk_gib,
            "gpus": [f"GPU-{serial}-{i}" for i in range(gpus)],
        }
        async with self.fleet.store.transaction() as tx:
            await tx.repository(NODES).record_inventory(node_id, "vm", offer, fake=True)
        # As the inventory controller notes a section its node signed (tests/integration/gateway/test_signed_facts.py
        # shows that path); an unchecked section offers nothing.
        [section] = [r for r in await self.fleet.store.repository(NODES).inventory(node_id) if r.section == "vm"]
        assert await self.fleet.store.repository(NODES).check_inventory(
            node_id, "vm", received_at=section.received_at, verdict="ok"
        )
        await self.set_node_state(node_id, "adopted")
        await self.tick()
        return Host(node_id=node_id, certificate_pem=result.certificate_pem)

    async def tick(self) -> None:
        """One pass of every job and reconciler, a second later, and not before the database's clock (which stamps
        new work items: on a busy machine more than a second of it may have passed since the last pass)."""
        clock = self.fleet.clock
        clock.set(max(clock.now() + dt.timedelta(seconds=1), dt.datetime.now(dt.UTC)))
        await self.fleet.compute.jobs.tick()

    async def set_node_state(self, node_id: str, state: str) -> None:
        await self.fleet.store.fetch(
            self.fleet.store.sql("UPDATE {s}.nodes SET state = :state WHERE id = :id RETURNING id"),
            {"state": state, "id": node_id},
        )

    async def desired(self, node_id: str) -> dict[str, Any]:
        rows = await self.fleet.store.repository(NODES).desired_newer([(node_id, -1)])
        return json.loads(json.dumps(rows[0].content)) if rows else {}

    async def report(self, host: Host, instances: list[dict[str, Any]]) -> Any:
        return await self.fleet.compute.gateway_services.call(
            "instances.report", certificate_pem=host.certificate_pem, input={"instances": instances}
        )
