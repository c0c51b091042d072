"""One database role per process mode (``PgStore.grant_roles``): PostgreSQL itself refuses what a mode may not do.

The gateway role may only execute the gateway's functions, so every read and write of a table, every sequence and
every other function is refused to it, and the gateway's whole door (``EDGE``) still works through it. The api and
worker roles read and write rows but own nothing: no DDL, and no UPDATE, DELETE or TRUNCATE of the audit tables.
"""

from __future__ import annotations

import datetime as dt
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator

import psycopg
import pytest
from psycopg import errors, sql

from bettercompute.errors import InvalidConfigError, NotFoundError
from bettercompute.modules.commands import EDGE, SignedAck
from bettercompute.modules.nodes import SignedFact
from bettercompute_store_pg import PgStore, RoleNames

from .._template import migrate_template

pytestmark = pytest.mark.anyio


_PASSWORD = uuid.uuid4().hex
"""The password the tests give the roles (``migrate`` makes them without one; the operator sets it)."""


def _as(url: str, role: str) -> str:
    """``url`` logging in as ``role``."""
    parts = urllib.parse.urlsplit(url)
    netloc = f"{role}:{_PASSWORD}@{parts.hostname}:{parts.port or 5432}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def _drop_roles(url: str, names: RoleNames) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for role in names.all():
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture
async def granted(database_url: str, empty_schema: str) -> AsyncIterator[tuple[str, RoleNames]]:
    """A migrated schema with its three roles, which are dropped after the test (roles are the cluster's)."""
    await migrate_template(database_url, empty_schema)
    names = RoleNames(f"bct_{uuid.uuid4().hex[:10]}")
    store = PgStore(database_url, schema=empty_schema, pool_size=1)
    try:
        assert await store.grant_roles(names.prefix) == names
        assert await store.grant_roles(names.prefix) == names  # again: nothing changes, nothing fails
        with psycopg.connect(database_url, autocommit=True) as conn:
            for role in names.all():
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(role), sql.Literal(_PASSWORD)))
        yield empty_schema, names
    finally:
        await store.close()
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(empty_schema)))
        _drop_roles(database_url, names)


@pytest.fixture
def node(database_url: str, granted: tuple[str, RoleNames]) -> Iterator[str]:
    """A live node in the granted schema, written as the schema's owner."""
    schema, _ = granted
    s = sql.Identifier(schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("INSERT INTO {}.pools (id, tenant, name, pool_class) VALUES ('pool-1', 't-1', 'p', 'gpu')").format(
                s
            )
        )
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.nodes (id, tenant, pool_id, state, hardware_key, desired_generation, desired_state, "
                "desired_at) VALUES ('node-1', 't-1', 'pool-1', 'adopted', 'hw-1', 2, '{{\"a\": 1}}', now())"
            ).format(s)
        )
    yield "node-1"


def _refused(url: str, statement: sql.Composed | str) -> None:
    """``statement`` fails for want of a privilege, and leaves nothing behind (its transaction is rolled back)."""
    with psycopg.connect(url) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(statement)


def _tables(url: str, schema: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace AND relkind IN ('r', 'p') "
            "ORDER BY relname",
            (schema,),
        ).fetchall()
    return [r[0] for r in rows]


async def test_the_gateway_role_reads_and_writes_no_table(database_url: str, granted: tuple[str, RoleNames]) -> None:
    schema, names = granted
    gateway = _as(database_url, names.gateway)
    tables = _tables(database_url, schema)
    # The tables that hold what a gateway must never read are among them, by name.
    for wanted in (
        "secrets",
        "join_tokens",
        "join_keys",
        "ca_keys",
        "signing_keys",
        "certificates",
        "iam_credentials",
        "audit",
    ):
        assert any(t == wanted or t.startswith(wanted) for t in tables), wanted
    for table in tables:
        name = sql.Identifier(schema, table)
        _refused(gateway, sql.SQL("SELECT * FROM {} LIMIT 1").format(name))
        _refused(gateway, sql.SQL("DELETE FROM {}").format(name))
    s = sql.Identifier(schema)
    _refused(gateway, sql.SQL("UPDATE {}.nodes SET state = 'failed'").format(s))
    _refused(gateway, sql.SQL("INSERT INTO {}.audit (action, actor, outcome) VALUES ('x', 'y', 'z')").format(s))
    _refused(gateway, sql.SQL("CREATE TABLE {}.mine (id int)").format(s))
    # The helpers that publish and enqueue, and the api's own functions, are not the gateway's to call.
    _refused(gateway, sql.SQL("SELECT {}.bc_gw_publish('node.adopted', 'n', '{{}}')").format(s))
    _refused(gateway, sql.SQL("SELECT {}.bc_gw_enqueue('node-lifecycle', 'n', 0)").format(s))
    with psycopg.connect(database_url) as conn:
        others = conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc AS p WHERE p.pronamespace = %s::regnamespace "
            "AND p.proname NOT LIKE 'bc_gw_%%' AND p.prokind = 'f' AND p.prorettype <> 'trigger'::regtype",
            (schema,),
        ).fetchall()
        sequences = conn.execute(
            "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace AND relkind = 'S'", (schema,)
        ).fetchall()
    assert others, "the schema has functions of the api's"
    with psycopg.connect(gateway) as conn:
        for (signature,) in others:
            allowed = conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (names.gateway, signature)
            ).fetchone()
            assert allowed == (False,), signature
    for (sequence,) in sequences:
        _refused(gateway, sql.SQL("SELECT nextval({})").format(sql.Literal(f"{schema}.{sequence}")))
    with psycopg.connect(gateway) as conn:
        for signature in RoleNames.gateway_functions:
            allowed = conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", (names.gateway, f"{schema}.{signature}")
            ).fetchone()
            assert allowed == (True,), signature


async def test_the_gateway_role_runs_the_whole_gateway_door(
    database_url: str, granted: tuple[str, RoleNames], node: str
) -> None:
    schema, names = granted
    store = PgStore(_as(database_url, names.gateway), schema=schema, pool_size=1)
    await store.open()
    try:
        edge = store.repository(EDGE)
        unsigned = SignedFact(signature=b"", serial="00", key=b"")
        epoch = await edge.open_session(node_id=node, gateway="gw-1")
        assert await edge.seen([(node, epoch)], gateway="gw-1") == [node]
        assert await edge.record_inventory(node, "gpus", '{"count": 1}', fake=True, epoch=epoch, signed=unsigned)
        await edge.report_event(node, type="xid.seen", payload={"xid": 79}, at_ms=1)
        [desired] = await edge.desired_newer([(node, 0)], gateway="gw-1")
        assert desired.generation == 2
        assert await edge.desired_newer([(node, 0)], gateway="gw-2") == []  # not a node of gw-2's
        changed, _ = await edge.desired_since(dt.datetime(2000, 1, 1, tzinfo=dt.UTC), gateway="gw-1")
        assert [d.node_id for d in changed] == [node]
        assert await edge.observe([SignedAck(node_id=node, generation=2, epoch=epoch, signed=unsigned)]) == [node]
        beyond = SignedAck(node_id=node, generation=3, epoch=epoch, signed=unsigned)  # beyond what was desired
        assert await edge.observe([beyond]) == []
        assert await edge.dispatch([(node, epoch)], limit=16) == []
        assert (
            await edge.finish(
                id="no-such", epoch=epoch, state="succeeded", result_json="{}", reason=None, signed=unsigned
            )
            is None
        )
        assert await edge.revoked_among(["00ff"]) == set()
        assert await edge.signers() == {}  # no instruction key made in this bare schema
        assert await edge.close_session(node_id=node, epoch=epoch, gateway="gw-1", reason="left")
        with pytest.raises(NotFoundError):
            await edge.open_session(node_id="no-such-node", gateway="gw-1")
    finally:
        await store.close()
    with psycopg.connect(database_url) as conn:
        s = sql.Identifier(schema)
        events = conn.execute(sql.SQL("SELECT type FROM {}.outbox ORDER BY id").format(s)).fetchall()
        work = conn.execute(sql.SQL("SELECT kind FROM {}.work_queue ORDER BY kind").format(s)).fetchall()
    assert [e[0] for e in events] == [
        "node.session_opened",
        "node.inventory_reported",
        "node.reported",
        "node.session_closed",
    ]
    assert [w[0] for w in work] == ["desired-acked", "inventory", "node-lifecycle"]


async def test_the_api_and_worker_roles_write_rows_but_not_the_schema_or_the_audit(
    database_url: str, granted: tuple[str, RoleNames], node: str
) -> None:
    schema, names = granted
    s = sql.Identifier(schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.audit (action, actor, resource_type, outcome) "
                "VALUES ('nodes.get', 'root', 'node', 'allowed')"
            ).format(s)
        )
    for role in (names.api, names.worker):
        url = _as(database_url, role)
        with psycopg.connect(url) as conn:
            assert conn.execute(sql.SQL("SELECT count(*) FROM {}.nodes").format(s)).fetchone() == (1,)
            conn.execute(sql.SQL("UPDATE {}.nodes SET updated_at = now()").format(s))
            conn.rollback()
        _refused(url, sql.SQL("UPDATE {}.audit SET actor = 'someone else'").format(s))
        _refused(url, sql.SQL("DELETE FROM {}.audit").format(s))
        _refused(url, sql.SQL("TRUNCATE {}.audit").format(s))
        _refused(url, sql.SQL("CREATE TABLE {}.mine (id int)").format(s))
        _refused(url, sql.SQL("DROP TABLE {}.nodes").format(s))
        _refused(url, sql.SQL("ALTER TABLE {}.nodes ADD COLUMN mine int").format(s))


async def test_a_bad_prefix_is_refused_before_anything_is_made(database_url: str, empty_schema: str) -> None:
    store = PgStore(database_url, schema=empty_schema, pool_size=1)
    try:
        for prefix in ("Bad", "pg_x", "a-b", "x" * 51, "a\x00b", "\uff41\uff50\uff49"):
            with pytest.raises(InvalidConfigError):
                await store.grant_roles(prefix)
    finally:
        await store.close()
