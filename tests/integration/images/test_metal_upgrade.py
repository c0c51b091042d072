"""A schema bare metal migrated to its version 1 (images in ``metal_images``) upgrades in place: the images move to
the core's ``images`` table with their ids, the machines' and sites' references follow them, and every image is
found by ``images.get`` afterwards."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import psycopg
import pytest

from bettercompute import JoinSettings, LocalKeyKms
from bettercompute.errors import ComputeError
from bettercompute.modules.images import GetImageInput, ListImagesInput
from bettercompute.ports import ResourceRef
from bettercompute_metal import MetalGroups, MetalModule
from bettercompute_metal._pg import MIGRATIONS as METAL_MIGRATIONS
from bettercompute_metal._schemas import DeployInput, GetSiteInput, MachineInput
from bettercompute_store_pg import PgStore

from ..iam.conftest import two_tenants

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

SHA = "f" * 64
CREATED = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


async def _metal_v1(url: str, schema: str) -> None:
    """What a control plane with bare metal's version 1 left: a pool, three images, a site and a machine using them
    (projected as bare metal projected its images)."""
    async with PgStore(url, schema=schema, pool_size=2) as store:
        await store.install()
        await store.migrate("pools", store.migrations("pools"))
        assert await store.migrate("metal", [m for m in METAL_MIGRATIONS if m.version == 1]) == [1]
        with psycopg.connect(url, autocommit=True) as conn:
            s = f'"{schema}"'
            conn.execute(
                f"INSERT INTO {s}.pools (id, tenant, name, pool_class) VALUES ('pool_old', 'tn_old', 'rack', 'gpu')"
            )
            for image_id, name, kind, size in [
                ("img_kernel", "rd-kernel", "kernel", 100),
                ("img_initrd", "rd-initrd", "initrd", None),
                ("img_disk", "ubuntu", "disk", 1 << 30),
            ]:
                conn.execute(
                    f"INSERT INTO {s}.metal_images (id, tenant, name, kind, url, sha256, size, created_at)"
                    " VALUES (%s, 'tn_old', %s, %s, %s, %s, %s, %s)",
                    (image_id, name, kind, f"http://10.0.0.1/{name}", SHA, size, CREATED),
                )
            conn.execute(
                f"INSERT INTO {s}.metal_sites (id, tenant, pool_id, name, ramdisk_kernel, ramdisk_initrd)"
                " VALUES ('site_old', 'tn_old', 'pool_old', 'rack-1', 'img_kernel', 'img_initrd')"
            )
            conn.execute(
                f"INSERT INTO {s}.metal_machines (id, tenant, pool_id, site_id, node_id, state, bmc_url,"
                " bmc_username, bmc_tls, bmc_secret, image_id, disk)"
                " VALUES ('mch_old', 'tn_old', 'pool_old', 'site_old', 'node_old', 'deployed', 'https://10.0.0.9',"
                " 'admin', '{\"pin_sha256\": \"00\"}', '\\x00', 'img_disk', 'sda')"
            )
        async with store.transaction() as tx:
            for image_id in ("img_kernel", "img_initrd", "img_disk"):
                await tx.project(ResourceRef(type="image", id=image_id, tenant="tn_old"))


def _foreign_keys(url: str, schema: str) -> set[tuple[str, str, str]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT conrelid::regclass::text, conname, confrelid::regclass::text FROM pg_constraint"
            " WHERE contype = 'f' AND connamespace = %s::regnamespace",
            (schema,),
        ).fetchall()
    prefix = f"{schema}."
    return {(t.removeprefix(prefix), n, r.removeprefix(prefix)) for t, n, r in rows if "metal" in t}


async def test_metal_v1_images_move_to_the_core_with_their_ids(
    database_url: str, empty_schema: str, tmp_path: Path
) -> None:
    await _metal_v1(database_url, empty_schema)
    join = JoinSettings(gateway_address="gw.upgrade.test:7443", trust_domain="upgrade.test")
    kms = LocalKeyKms(tmp_path / "kms.key")
    async with two_tenants(database_url, empty_schema, kms=kms, join=join, modules=[MetalModule()]) as t:
        api = t.compute.api
        kernel = await api.images.get(t.root, GetImageInput(id="img_kernel"))
        initrd = await api.images.get(t.root, GetImageInput(id="img_initrd"))
        disk = await api.images.get(t.root, GetImageInput(id="img_disk"))
        assert (kernel.kind, kernel.size, kernel.format, kernel.url) == (
            "kernel",
            100,
            None,
            "http://10.0.0.1/rd-kernel",
        )
        assert (initrd.kind, initrd.size, initrd.format) == ("initrd", None, None)
        # Bare metal wrote every disk image as it is: raw.
        assert (disk.kind, disk.size, disk.format, disk.sha256) == ("disk", 1 << 30, "raw", SHA)
        assert disk.created_at == CREATED and disk.created_by is None and disk.provider_images == {}
        listed = await api.images.list(t.root, ListImagesInput(tenant="tn_old"))
        # One creation time: in id order.
        assert [i.id for i in listed.images] == ["img_disk", "img_initrd", "img_kernel"]

        # Bare metal reads them from the core now: the site and the machine still name them.
        metal = MetalGroups(api)
        site = await metal.sites.get(t.root, GetSiteInput(id="site_old"))
        assert (site.ramdisk_kernel, site.ramdisk_initrd) == ("img_kernel", "img_initrd")
        machine = await metal.metal.get(t.root, MachineInput(id="mch_old"))
        assert machine.image_id == "img_disk"
        # A kernel is no disk to deploy, as before; what refuses it is the core's record of its kind.
        with pytest.raises(ComputeError) as refused:
            await metal.metal.deploy(t.root, DeployInput(id="mch_old", image_id="img_kernel"))
        assert refused.value.code == "INVALID_INPUT"

        # The old table is gone and the references point at the core's table.
        with psycopg.connect(database_url) as conn:
            gone = conn.execute("SELECT to_regclass(%s)", (f'"{empty_schema}".metal_images',)).fetchone()
            assert gone == (None,)
            recorded = conn.execute(
                f'SELECT version FROM "{empty_schema}".schema_migrations WHERE module = %s ORDER BY version',
                ("metal",),
            ).fetchall()
            assert recorded == [(1,), (2,)]
            with pytest.raises(psycopg.errors.ForeignKeyViolation):
                conn.execute(f"UPDATE \"{empty_schema}\".metal_machines SET image_id = 'img_none' WHERE id = 'mch_old'")
        assert {
            ("metal_machines", "metal_machines_image_id_fkey", "images"),
            ("metal_sites", "metal_sites_ramdisk_kernel_fkey", "images"),
            ("metal_sites", "metal_sites_ramdisk_initrd_fkey", "images"),
        } <= _foreign_keys(database_url, empty_schema)


async def test_the_core_migrates_images_before_any_module_of_the_options(
    database_url: str, empty_schema: str, tmp_path: Path
) -> None:
    join = JoinSettings(gateway_address="gw.upgrade.test:7443", trust_domain="upgrade.test")
    kms = LocalKeyKms(tmp_path / "kms.key")
    async with two_tenants(database_url, empty_schema, kms=kms, join=join, modules=[MetalModule()]) as t:
        order = [m.name for m in t.compute._modules]
        assert order.index("images") < order.index("metal")
        # A fresh schema ran bare metal's both versions: the second one moved nothing and dropped the old table.
        with psycopg.connect(database_url) as conn:
            assert conn.execute("SELECT to_regclass(%s)", (f'"{empty_schema}".metal_images',)).fetchone() == (None,)
