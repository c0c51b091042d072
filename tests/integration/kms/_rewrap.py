"""A control plane's stored KMS blobs of every kind, re-wrapped from one KMS key to another (shared by the re-wrap
tests of each adapter)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest

from bettercompute import BetterCompute, JoinSettings, KmsRing, Options, better_compute
from bettercompute.errors import InternalError, InvalidConfigError
from bettercompute.modules.nodes import GetRewrapInput, Rewrap, RotateKeyInput, StartRewrapInput
from bettercompute.modules.pools import CreatePoolInput
from bettercompute.modules.secrets import CreateSecretInput
from bettercompute.modules.webhooks import CreateWebhookInput, RotateWebhookSecretInput
from bettercompute.ports import Kms, SealedBlob
from bettercompute_iam import EmbeddedIam
from bettercompute_metal import MetalGroups, MetalModule
from bettercompute_metal._schemas import BmcInput, CreateSiteInput, EnrollInput
from bettercompute_store_pg import PgStore

from ..iam.conftest import two_tenants

JOIN = JoinSettings(gateway_address="gw.rewrap.test:7443", trust_domain="rewrap.test")

COLUMNS = (
    "webhooks.sealed_secrets",
    "webhooks.sealed_previous_secrets",
    "secrets.sealed_secrets",
    "nodes.sealed_ca_keys",
    "nodes.sealed_signing_keys",
    "nodes.sealed_join_keys",
    "metal.sealed_bmc_credentials",
)
"""Every sealed column of a control plane with the built-in modules and bare metal, in the order a re-wrap walks
them (the modules' order)."""


@attrs.frozen
class Seeded:
    root: str
    acme: str
    pool: str
    secrets: dict[str, str]
    """Each secret's name and value."""


async def seed(compute: BetterCompute, root: str, acme: str, alice: str) -> Seeded:
    """Blobs in every sealed column: secrets, webhooks (one rotated, so it holds a previous secret too), a machine's
    BMC credentials, a rotated CA (a root and two intermediates), an instruction key and JoinService's key."""
    api: Any = compute.api
    pool = await api.pools.create(alice, CreatePoolInput(tenant=acme, name="metal"))
    values = {f"db-{n}": f"pässword \u202e{n}" for n in range(5)}
    for name, value in values.items():
        await api.secrets.create(alice, CreateSecretInput(tenant=acme, name=name, scope=f"pool:{pool.id}", value=value))
    for n in range(3):
        hook = await api.webhooks.create(alice, CreateWebhookInput(tenant=acme, url=f"https://hooks.example.com/{n}"))
        if n == 0:
            await api.webhooks.rotate_secret(alice, RotateWebhookSecretInput(tenant=acme, id=hook.webhook.id))
    metal = MetalGroups(compute.api)
    site = await metal.sites.create(alice, CreateSiteInput(tenant=acme, pool_id=pool.id, name="dc-1"))
    await metal.metal.enroll(
        alice,
        EnrollInput(
            site_id=site.id,
            bmc=BmcInput(url="https://127.0.0.1:9", username="admin", password="bmc-secret", pin_sha256="ab" * 32),
        ),
    )
    await api.keys.rotate(root, RotateKeyInput(kind="ca"))
    return Seeded(root=root, acme=acme, pool=pool.id, secrets=values)


async def blobs(compute: BetterCompute) -> dict[str, list[SealedBlob]]:
    """Every stored blob, by sealed column."""
    found: dict[str, list[SealedBlob]] = {}
    for key in compute.context.sealed:
        found[f"{key.module}.{key.name}"] = await compute.context.store.repository(key).sealed(after=None, limit=1000)
    return found


@contextlib.asynccontextmanager
async def process(database_url: str, schema: str, kms: Kms, instance: str) -> AsyncIterator[BetterCompute]:
    """Another process of the same control plane, with ``kms``."""
    compute = better_compute(
        Options(
            store=PgStore(database_url, schema=schema, pool_size=4),
            iam=EmbeddedIam(),
            kms=kms,
            join=JOIN,
            modules=[MetalModule()],
            instance=instance,
        )
    )
    await compute.initialize()
    try:
        yield compute
    finally:
        await compute.close()


async def rewrap_every_blob(database_url: str, schema: str, old: Kms, new: Kms) -> tuple[Rewrap, int]:
    """Seed blobs under ``old``; give a second process ``KmsRing(new, old)`` and re-wrap; then check that ``new``
    alone opens every stored blob, and ``old`` none. The finished re-wrap and how many blobs there were."""
    async with two_tenants(database_url, schema, kms=old, join=JOIN, modules=[MetalModule()]) as t:
        seeded = await seed(t.compute, t.root, t.acme, t.alice)
        before = await blobs(t.compute)
    assert tuple(before) == COLUMNS and all(before.values()), {k: len(v) for k, v in before.items()}
    total = sum(len(v) for v in before.values())

    async with process(database_url, schema, KmsRing(new, old), "rewrap-1") as ring:
        api: Any = ring.api
        started = await api.keys.rewrap(seeded.root, StartRewrapInput())
        assert started.state == "running" and started.columns == COLUMNS
        for _ in range(50):
            await ring.jobs.tick({"controllers"})
            done = await api.keys.get_rewrap(seeded.root, GetRewrapInput(id=started.id))
            if done.state == "done":
                break
        assert done.state == "done" and done.finished_at is not None, done

    async with process(database_url, schema, new, "rewrap-2") as alone:
        after = await blobs(alone)
        assert {k: len(v) for k, v in after.items()} == {k: len(v) for k, v in before.items()}
        for stored in after.values():
            for blob in stored:
                await new.decrypt(blob.blob, context=blob.context)  # raises if any stayed under the old key
                with pytest.raises((InternalError, InvalidConfigError)):
                    await old.decrypt(blob.blob, context=blob.context)
        # Each secret's value is the one it was made with.
        for name, value in seeded.secrets.items():
            secret = next(b for b in after["secrets.sealed_secrets"] if b.context.endswith(f":{name}"))
            assert (await new.decrypt(secret.blob, context=secret.context)).decode() == value
        # The CA still issues and the instruction key still signs (both opened from the store under the new key).
        api = alone.api
        await api.keys.rotate(seeded.root, RotateKeyInput(kind="instructions"))
        await api.keys.rotate(seeded.root, RotateKeyInput(kind="ca"))
    return done, total
