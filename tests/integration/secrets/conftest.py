"""A control plane with a KMS (so the ``secrets`` group is registered), two tenants and an admin in each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from bettercompute import BetterCompute, LocalKeyKms
from bettercompute.modules.secrets import SecretBroker, SecretsGroup
from bettercompute.testing import GuardedKms
from bettercompute_store_pg import PgStore

from ..iam.conftest import two_tenants


@attrs.frozen(kw_only=True)
class Vault:
    compute: BetterCompute
    store: PgStore
    broker: SecretBroker
    kms: GuardedKms
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
    kms = GuardedKms(LocalKeyKms(tmp_path / "kms.key"))  # fails a KMS call made inside a transaction
    async with two_tenants(database_url, fresh_schema, kms=kms) as t:
        yield Vault(
            compute=t.compute,
            store=t.store,
            broker=SecretBroker(t.store, kms),
            kms=kms,
            acme=t.acme,
            alice=t.alice,
            globex=t.globex,
            mallory=t.mallory,
            http=t.http,
        )
