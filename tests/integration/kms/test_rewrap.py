"""A KMS key rotation: every stored blob (CA, instruction and JoinService keys, secrets, webhook secrets, BMC
credentials) is sealed again under the new key by a resumable ``controllers`` job, then opens under it alone; a blob
that opens under no key is named and left as it was; a row changed meanwhile is never overwritten; starting is
root's alone, one at a time, and audited."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from bettercompute import KmsRing, LocalKeyKms
from bettercompute.errors import (
    AccessDeniedError,
    ConflictError,
    FailedPreconditionError,
    NotFoundError,
)
from bettercompute.modules.audit import ListAuditInput
from bettercompute.modules.nodes import REWRAPS, GetRewrapInput, StartRewrapInput, _rewrap
from bettercompute.modules.secrets import SEALED_SECRETS, CreateSecretInput
from bettercompute_metal import MetalModule

from ..iam.conftest import two_tenants
from ._rewrap import COLUMNS, JOIN, blobs, process, rewrap_every_blob, seed

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


async def test_every_stored_blob_is_sealed_again_under_the_new_key(
    database_url: str, fresh_schema: str, tmp_path: Path
) -> None:
    old, new = LocalKeyKms(tmp_path / "old.key"), LocalKeyKms(tmp_path / "new.key")
    done, total = await rewrap_every_blob(database_url, fresh_schema, old, new)
    assert (done.resealed, done.failed, done.failures, done.columns_done) == (total, 0, (), len(COLUMNS))


async def test_a_rewrap_goes_on_where_it_stopped_in_another_process_and_names_what_opens_nowhere(
    database_url: str, fresh_schema: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new, stranger = (LocalKeyKms(tmp_path / f"{n}.key") for n in ("old", "new", "stranger"))
    async with two_tenants(database_url, fresh_schema, kms=old, join=JOIN, modules=[MetalModule()]) as t:
        seeded = await seed(t.compute, t.root, t.acme, t.alice)
        api: Any = t.compute.api
        # A secret whose blob no key of the ring opens (sealed under a key nobody has any more).
        await api.secrets.create(
            t.alice, CreateSecretInput(tenant=t.acme, name="lost", scope=f"pool:{seeded.pool}", value="v")
        )
        lost = next(b for b in (await blobs(t.compute))["secrets.sealed_secrets"] if b.context.endswith(":lost"))
        foreign = await stranger.encrypt(b"v", context=lost.context)
        assert await t.compute.context.store.repository(SEALED_SECRETS).reseal(lost.key, old=lost.blob, new=foreign)
        # A row that changed since it was read is never overwritten.
        assert not await t.compute.context.store.repository(SEALED_SECRETS).reseal(lost.key, old=lost.blob, new=b"x")
        with pytest.raises(AccessDeniedError):
            await api.keys.rewrap(t.alice, StartRewrapInput())  # a tenant's admin cannot
    total = sum(len(v) for v in (await _count(database_url, fresh_schema, old)).values())

    monkeypatch.setattr(_rewrap, "BATCH", 2)
    monkeypatch.setattr(_rewrap, "PASS_LIMIT", 3)  # two batches a pass: many passes, each kept as it ends
    async with process(database_url, fresh_schema, KmsRing(new, old), "rewrap-1") as first:
        api = first.api
        started = await api.keys.rewrap(seeded.root, StartRewrapInput())
        with pytest.raises(ConflictError) as running:
            await api.keys.rewrap(seeded.root, StartRewrapInput())
        assert running.value.details["id"] == started.id
        await first.jobs.tick({"controllers"})
        partway = await api.keys.get_rewrap(seeded.root, GetRewrapInput(id=started.id))
        assert (partway.state, partway.resealed, partway.columns_done) == ("running", 3, 0)  # two batches: 2 + 1
    # The first process is gone; another one, started later, takes it from where it was.
    async with process(database_url, fresh_schema, KmsRing(new, old), "rewrap-2") as second:
        api = second.api
        for _ in range(total):
            await second.jobs.tick({"controllers"})
            done = await api.keys.get_rewrap(seeded.root, GetRewrapInput(id=started.id))
            if done.state == "done":
                break
        assert done.state == "done"
        assert (done.resealed, done.failed) == (total - 1, 1)
        assert [(f.column, f.key) for f in done.failures] == [("secrets.sealed_secrets", lost.key)]
        stored = next(b for b in (await blobs(second))["secrets.sealed_secrets"] if b.key == lost.key)
        assert stored.blob == foreign  # left as it was
        # Nothing runs now: a new re-wrap may start.
        again = await api.keys.rewrap(seeded.root, StartRewrapInput())
        assert again.id != started.id and again.state == "running"
        with pytest.raises(NotFoundError):
            await api.keys.get_rewrap(seeded.root, GetRewrapInput(id="kmr_0000000000000000"))
        audited = await api.audit.list(seeded.root, ListAuditInput(resource_type="key", limit=100))
        rewraps = [(row.resource_id, row.outcome) for row in audited.entries if row.action == "compute:keys:rewrap"]
        assert sorted(rewraps, key=str) == sorted([(started.id, "ok"), (again.id, "ok"), (None, "denied")], key=str), (
            rewraps
        )


async def test_a_rewrap_needs_a_kms(database_url: str, fresh_schema: str) -> None:
    async with two_tenants(database_url, fresh_schema) as t:
        api: Any = t.compute.api
        with pytest.raises(FailedPreconditionError):
            await api.keys.rewrap(t.root, StartRewrapInput())


async def _count(database_url: str, schema: str, kms: Any) -> dict[str, list[Any]]:
    async with process(database_url, schema, kms, "counter") as counter:
        return await blobs(counter)


async def test_a_rewrap_of_some_columns_only_leaves_the_others_and_an_unknown_column_is_invalid_input(
    database_url: str, fresh_schema: str, tmp_path: Path
) -> None:
    old, new = LocalKeyKms(tmp_path / "old.key"), LocalKeyKms(tmp_path / "new.key")
    async with two_tenants(database_url, fresh_schema, kms=old, join=JOIN, modules=[MetalModule()]) as t:
        seeded = await seed(t.compute, t.root, t.acme, t.alice)
    async with process(database_url, fresh_schema, KmsRing(new, old), "rewrap-1") as ring:
        api: Any = ring.api
        with pytest.raises(NotFoundError) as unknown:
            await api.keys.rewrap(seeded.root, StartRewrapInput(columns=("nodes.nope",)))
        assert unknown.value.details["unknown"] == ["nodes.nope"]
        # Over HTTP, text that is not a column's name (a NUL byte, a full-width letter, a bidirectional mark, an
        # unpaired surrogate) is refused by the schema, and nothing starts.
        headers = {"authorization": f"Bearer {seeded.root}", "content-type": "application/json"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=ring.asgi), base_url="http://test") as http:
            for text in (
                r"secrets.sealed_secrets\u0000",
                "\uff53ecrets.sealed_secrets",
                r"\u202esecrets.x",
                r"\ud800.x",
            ):
                body = '{"columns": ["' + text + '"]}'
                answer = await http.post("/api/compute/keys/rewrap", headers=headers, content=body.encode())
                assert answer.status_code == 400 and answer.json()["error"]["code"] == "INVALID_INPUT", answer.text
        started = await api.keys.rewrap(seeded.root, StartRewrapInput(columns=("secrets.sealed_secrets",)))
        assert started.columns == ("secrets.sealed_secrets",)
        while (await api.keys.get_rewrap(seeded.root, GetRewrapInput(id=started.id))).state == "running":
            await ring.jobs.tick({"controllers"})
        stored = await blobs(ring)
    for column, found in stored.items():
        for blob in found:
            await (new if column == "secrets.sealed_secrets" else old).decrypt(blob.blob, context=blob.context)


async def test_a_burst_of_starts_larger_than_the_pool_starts_one_re_wrap_and_answers_every_other_conflict(
    database_url: str, fresh_schema: str, tmp_path: Path
) -> None:
    old, new = LocalKeyKms(tmp_path / "old.key"), LocalKeyKms(tmp_path / "new.key")
    async with two_tenants(database_url, fresh_schema, kms=old, join=JOIN, modules=[MetalModule()]) as t:
        seeded = await seed(t.compute, t.root, t.acme, t.alice)
    async with process(database_url, fresh_schema, KmsRing(new, old), "rewrap-burst") as ring:  # a pool of 4
        api: Any = ring.api
        outcomes: list[str] = []

        async def start() -> None:
            try:
                outcomes.append((await api.keys.rewrap(seeded.root, StartRewrapInput())).id)
            except ConflictError as exc:
                outcomes.append(f"CONFLICT {exc.details['id']}")

        async with anyio.create_task_group() as tg:
            for _ in range(16):
                tg.start_soon(start)
        started = [o for o in outcomes if not o.startswith("CONFLICT")]
        assert len(outcomes) == 16 and len(started) == 1
        # Each refusal names the one that runs (or, for one that lost before it committed, none yet).
        assert {o.removeprefix("CONFLICT ") for o in outcomes} <= {started[0], "None"}
        running = await ring.context.store.repository(REWRAPS).running()
        assert running is not None and running.id == started[0]
