"""A control plane with a KMS (so the ``secrets`` group is registered), two tenants and an admin in each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from bettercompute import BetterCompute, LocalKeyKms, Options, better_compute
from bettercompute.modules.secrets import SecretBroker, SecretsGroup
from bettercompute_iam import CreateTenantInput, EmbeddedIam
from bettercompute_store_pg import PgStore

from ..iam.conftest import make_user


@attrs.frozen(kw_only=True)
class Vault:
    compute: BetterCompute
    store: PgStore
    broker: SecretBroker
    acme: str
    alice: str
    globex: str
    mallory: str
    http: httpx.AsyncClient

    @property
    def api(self) -> SecretsGroup[Any]:
        group: SecretsGroup[Any] = self.compute.api.group(SecretsGroup)
        return group


@pytest.fixture
async def vault(database_url: str, fresh_schema: str, tmp_path: Path) -> AsyncIterator[Vault]:
    store = PgStore(database_url, schema=fresh_schema, pool_size=4)
    iam = EmbeddedIam()
    kms = LocalKeyKms(tmp_path / "kms.key")
    compute = better_compute(Options(store=store, iam=iam, instance="test-1", kms=kms))
    await compute.initialize()
    boot = await iam.bootstrap()
    assert boot.credential is not None
    root = boot.credential
    transport = httpx.ASGITransport(app=compute.asgi)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            acme = (await compute.api.tenants.create(root, CreateTenantInput(name="acme"))).id
            globex = (await compute.api.tenants.create(root, CreateTenantInput(name="globex"))).id
            plane: Any = attrs.make_class("P", ["compute", "root"])(compute, root)
            _, alice, _ = await make_user(plane, acme, "alice", "compute.admin")
            _, mallory, _ = await make_user(plane, globex, "mallory", "compute.admin")
            yield Vault(
                compute=compute,
                store=store,
                broker=SecretBroker(store, kms),
                acme=acme,
                alice=alice,
                globex=globex,
                mallory=mallory,
                http=http,
            )
    finally:
        await compute.close()
