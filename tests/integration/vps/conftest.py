"""A control plane with the VPS module, JoinService and a KMS (the joins fixtures, with ``modules`` overridden), and
helpers that act as a node's daemon does: join, offer VM capacity, report instances through ``instances.report``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import pytest

from bettercompute.modules.images import RegisterImageInput
from bettercompute.modules.nodes import NODES
from bettercompute_vps import VpsGroups, VpsModule

from ..joins.conftest import Fleet, attestors, certificate_ttl, claims, clock, fleet

__all__ = ["Host", "Vps", "attestors", "certificate_ttl", "clock", "fleet", "modules"]

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
        await self.set_node_state(node_id, "adopted")
        await self.fleet.compute.jobs.tick()
        return Host(node_id=node_id, certificate_pem=result.certificate_pem)

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
