"""PostgreSQL-specific behaviour of ``PgStore``: no I/O before ``open``, error translation, audit, adapters' access."""

from __future__ import annotations

import logging
import time
import types

import anyio
import pytest

import bettercompute_store_pg
from bettercompute.errors import ConflictError, InternalError, InvalidConfigError, UnavailableError
from bettercompute.ports import AuditRecord, WorkItem
from bettercompute_store_pg import PgNotifier, PgStore, Statement, connection_of, fetch_in
from tests._timing import deadline

pytestmark = pytest.mark.anyio

UNREACHABLE = "postgresql://someone:s3cret@127.0.0.1:1/nowhere"


def test_public_names() -> None:
    # Sub-packages (``modules``, each module's PostgreSQL side) are reached by name, not re-exported.
    public = sorted(
        name
        for name, value in vars(bettercompute_store_pg).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    )
    assert bettercompute_store_pg.__all__ == sorted(bettercompute_store_pg.__all__)
    assert set(public) == set(bettercompute_store_pg.__all__) - {"__version__"}
    assert bettercompute_store_pg.__version__ == "0.1.0"


async def test_constructing_does_no_io_and_an_unreachable_database_fails_fast() -> None:
    started = time.monotonic()
    store = PgStore(UNREACHABLE, schema="bc_unreachable")
    assert time.monotonic() - started < 0.5
    with pytest.raises(InternalError):
        async with store.connection():  # not open: no pool, hence no connection yet
            pass
    await store.open()
    try:
        for attempt in (store.ping(), store.install(), store.queue.pending()):
            with pytest.raises(UnavailableError) as caught:
                await attempt
            message = str(caught.value)
            assert message == "the database is unreachable"
            assert "s3cret" not in repr(caught.value) and "127.0.0.1" not in message
            assert caught.value.__cause__ is not None
        assert time.monotonic() - started < 5
    finally:
        await store.close()
    assert "s3cret" not in repr(store)


@pytest.mark.parametrize("schema", ["", "Upper", "bad-name", "x" * 64, "pg_catalog", 'a"b', "1abc"])
def test_unsafe_schema_names_are_refused(schema: str) -> None:
    with pytest.raises(InvalidConfigError):
        PgStore("postgresql://localhost/db", schema=schema)


@pytest.mark.parametrize("url", ["mysql://localhost/db", "postgresql+asyncpg://localhost/db", "not a url"])
def test_other_databases_and_drivers_are_refused(url: str) -> None:
    with pytest.raises(InvalidConfigError):
        PgStore(url)


async def test_driver_errors_become_internal_errors_without_sql(pg_store: PgStore) -> None:
    with pytest.raises(InternalError) as caught:
        async with pg_store.transaction() as tx:
            await fetch_in(tx.connection, Statement.of("SELECT * FROM no_such_table_here"), {})
    assert "no_such_table_here" not in str(caught.value)
    assert caught.value.__cause__ is not None


@pytest.mark.parametrize(
    ("statement", "params", "state"),
    [
        ("SELECT * FROM no_such_table_here", {}, "42P01"),
        # Refused by the driver before it reaches the server: text PostgreSQL cannot hold, no SQLSTATE.
        ("SELECT CAST(:v AS text) AS no_such_table_here", {"v": "s3cr3t\x00"}, "unknown"),
    ],
)
async def test_an_unexpected_database_error_is_logged_by_class_and_sqlstate_only(
    pg_store: PgStore, caplog: pytest.LogCaptureFixture, statement: str, params: dict[str, str], state: str
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(InternalError):
        async with pg_store.transaction() as tx:
            await fetch_in(connection_of(tx), Statement.of(statement), params)
    logged = [r.getMessage() for r in caplog.records if r.name == "bettercompute.store_pg"]
    assert any(f"SQLSTATE {state}" in line for line in logged), logged
    assert "no_such_table_here" not in caplog.text and "s3cr3t" not in caplog.text


async def test_audit_rows_commit_with_the_transaction(pg_store: PgStore) -> None:
    record = AuditRecord(
        action="compute:reservations:create",
        actor="p-1",
        tenant="t-1",
        resource_type="reservation",
        resource_id="r-1",
        decision_id="d-1",
        details={"gpus": 2},
    )
    async with pg_store.transaction() as tx:
        await tx.audit(record)
    with pytest.raises(RuntimeError):
        async with pg_store.transaction() as tx:
            await tx.audit(record)
            raise RuntimeError("the caller failed")
    rows = await pg_store.fetch(pg_store.sql("SELECT * FROM {s}.audit"), {})
    assert len(rows) == 1
    row = rows[0]
    assert (row.action, row.actor, row.tenant, row.resource_id, row.outcome) == (
        "compute:reservations:create",
        "p-1",
        "t-1",
        "r-1",
        "ok",
    )
    assert row.details == {"gpus": 2}


async def test_adapters_write_their_own_tables_in_the_same_transaction(pg_store: PgStore) -> None:
    async with pg_store.connection() as conn:
        await conn.execute(f'CREATE TABLE "{pg_store.schema}".adapter_rows (id integer)')
    with pytest.raises(RuntimeError):
        async with pg_store.transaction() as tx:
            await connection_of(tx).execute(f'INSERT INTO "{pg_store.schema}".adapter_rows VALUES (1)')
            await tx.enqueue([WorkItem(kind="k", key="x")])
            raise RuntimeError("the caller failed")
    rows = await pg_store.fetch(pg_store.sql("SELECT count(*) AS n FROM {s}.adapter_rows"), {})
    assert rows[0].n == 0
    assert await pg_store.queue.pending() == 0


async def test_naive_run_at_is_refused(pg_store: PgStore) -> None:
    import datetime as dt

    from bettercompute.errors import InvalidInputError

    with pytest.raises(InvalidInputError):
        await pg_store.queue.enqueue([WorkItem(kind="k", key="x", run_at=dt.datetime(2030, 1, 1))])


async def test_open_and_close_are_idempotent(database_url: str, fresh_schema: str) -> None:
    store = PgStore(database_url, schema=fresh_schema)
    await store.open()
    await store.open()
    await store.ping()
    await store.close()
    await store.close()
    with pytest.raises(InternalError):
        await store.ping()


async def test_notifier_delivers_pokes_per_schema(database_url: str) -> None:
    async with PgNotifier(database_url, schema="bc_n_one") as one, PgNotifier(database_url, schema="bc_n_two") as two:
        await one.notify("nobody-listens", "fine")
        async with one.listen("wake") as pokes, two.listen("wake") as other_pokes:
            await two.notify("wake", "for two")
            await one.notify("wake", "hello")
            with anyio.fail_after(deadline(5)):
                assert await anext(aiter(pokes)) == "hello"
                assert await anext(aiter(other_pokes)) == "for two"


async def test_a_burst_of_the_same_poke_is_sent_as_few_and_none_is_lost(database_url: str) -> None:
    # 200 commits poking at once: identical pokes waiting for the one sending connection are sent once, so the
    # listener hears far fewer than 200, yet a poke after the burst still arrives, and other payloads are not merged.
    async with PgNotifier(database_url, schema="bc_n_burst") as notifier, notifier.listen("work") as pokes:
        async with anyio.create_task_group() as tg:
            for _ in range(200):
                tg.start_soon(notifier.notify, "work", "reconcile.node")
            tg.start_soon(notifier.notify, "work", "@sinks")
        await notifier.notify("work", "last")
        heard: list[str] = []
        with anyio.fail_after(deadline(5)):
            async for payload in pokes:
                heard.append(payload)
                if payload == "last":
                    break
    assert 1 <= heard.count("reconcile.node") < 20
    assert heard.count("@sinks") == 1


async def test_a_unique_violation_is_a_conflict_without_sql(pg_store: PgStore) -> None:
    # What a race between two writers of one name ends in, once the loser's own checks passed.
    table = f'"{pg_store.schema}".names'
    async with pg_store.transaction() as tx:
        await fetch_in(tx.connection, Statement.of(f"CREATE TABLE {table} (name text PRIMARY KEY)"), {})
        await fetch_in(tx.connection, Statement.of(f"INSERT INTO {table} VALUES ('a')"), {})
    with pytest.raises(ConflictError) as info:
        async with pg_store.transaction() as tx:
            await fetch_in(tx.connection, Statement.of(f"INSERT INTO {table} VALUES ('a')"), {})
    assert info.value.code == "CONFLICT"
    assert "INSERT" not in info.value.message and "names" not in info.value.message
