"""IAM's jobs: expired credentials are recorded as such, once, with an audit row, under the iam role's lease."""

from __future__ import annotations

import psycopg
import pytest

from bettercompute.errors import UnauthenticatedError
from bettercompute.modules.system import VersionInput
from bettercompute.ports import ResourceRef

from ..conftest import Plane

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_expired_credentials_are_recorded_once(plane: Plane, database_url: str, fresh_schema: str) -> None:
    credential_id = plane.root.split("_", 1)[1].split(".")[0]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE \"{fresh_schema}\".iam_credentials SET expires_at = now() - interval '1 second' WHERE id = %s",
            (credential_id,),
        )
    with pytest.raises(UnauthenticatedError):
        await plane.compute.api.system.version(plane.root, VersionInput())
    assert (await plane.compute.jobs.tick({"iam"}))["iam/expire-credentials"] == 1
    assert (await plane.compute.jobs.tick({"iam"}))["iam/expire-credentials"] == 0
    with psycopg.connect(database_url) as conn:
        expired_at = conn.execute(
            f'SELECT expired_at IS NOT NULL FROM "{fresh_schema}".iam_credentials WHERE id = %s', (credential_id,)
        ).fetchone()
        audits = conn.execute(
            f'SELECT action, actor, resource_id FROM "{fresh_schema}".audit WHERE action = %s',
            ("iam:credentials:expire",),
        ).fetchall()
    assert expired_at == (True,)
    assert audits == [("iam:credentials:expire", "system", credential_id)]


async def test_the_iam_role_runs_its_jobs_under_a_lease(plane: Plane) -> None:
    await plane.compute.start({"iam"})
    try:
        lease = await plane.store.leases.get("iam/expire-credentials")
        assert lease is not None
    finally:
        await plane.compute.stop()


async def test_the_projection_check_counts_resources_of_unknown_tenants(
    plane: Plane, caplog: pytest.LogCaptureFixture
) -> None:
    async with plane.store.transaction() as tx:
        await tx.project(ResourceRef(type="widget", id="wd_1", tenant="root"))
        await tx.project(ResourceRef(type="widget", id="wd_2", tenant="tn_gone"))
    assert (await plane.compute.jobs.tick({"iam"}))["iam/check-projection"] == 1
    assert "1 projected resource(s) name a tenant that does not exist" in caplog.text
    async with plane.store.transaction() as tx:
        await tx.unproject("widget", "wd_2")
    assert (await plane.compute.jobs.tick({"iam"}))["iam/check-projection"] == 0
