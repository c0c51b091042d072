"""Fixtures for tests against PostgreSQL: a fresh, migrated store per test, in a schema of its own.

A test's schema is a copy of one migrated once per session (``_template.py``), not migrated again: ``initialize()``
and ``install()`` find every migration recorded and apply nothing. After the test the copy is reset to the template
and renamed for the next one (``SchemaPool``), or dropped if the test changed its structure or started a process.
Tests of the migrations themselves take ``empty_schema``.
"""

from __future__ import annotations

import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator

import anyio
import attrs
import httpx
import psycopg
import pytest

from bettercompute import BetterCompute, Options, better_compute
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

from ._template import Template, clone_schema, migrate_template, recycle_schema, template_of


def new_schema() -> str:
    """A schema name no other test uses."""
    return f"bc_t_{uuid.uuid4().hex[:12]}"


def drop_schema(url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it (a plain connection, so teardown does not depend on the store), and the
    process roles ``better-compute migrate`` made for it (named after it), which are the cluster's, not the
    schema's."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        for mode in ("api", "worker", "gateway"):
            role = f"{schema}_{mode}"
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute(f'DROP OWNED BY "{role}"')
                conn.execute(f'DROP ROLE "{role}"')


@pytest.fixture(scope="session")
def schema_template(database_url: str) -> Iterator[Template]:
    """A schema migrated once for the session, and what copying it takes (it is dropped when the session ends)."""
    template = new_schema()
    try:
        anyio.run(migrate_template, database_url, template)
        yield template_of(database_url, template)
    finally:
        drop_schema(database_url, template)


@pytest.fixture(scope="session")
def schema_copy_script(schema_template: Template) -> str:
    """The SQL that copies the session's migrated template under the name ``{dst}``."""
    return schema_template.copy


_started = [0]
"""How many processes this pytest process has started (``subprocess``, ``asyncio``, ``anyio``, forks)."""


def _count_process_starts(event: str, args: tuple[object, ...]) -> None:
    if event in ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system"):
        _started[0] += 1


sys.addaudithook(_count_process_starts)


@attrs.frozen
class Lent:
    """A schema lent to a test, and what this process ran when it was lent (see ``SchemaPool.give_back``)."""

    schema: str
    processes: int
    threads: frozenset[threading.Thread]


class SchemaPool:
    """This process's copies of the template: a test's copy, handed back, is reset and renamed for the next test.

    Resetting a copy (its rows deleted, the template's rows and sequence positions again, under a new name) costs
    about a fifth of the server's CPU that making one and dropping it do (measured: 0.03 s against 0.16 s), and most
    tests take a copy. A copy is dropped instead when the test changed its structure or dropped it
    (``recycle_schema``), when it has been used ``REUSES`` times, and when something the test started may still use
    it: a statement psycopg prepared is bound to the tables, not to the schema's name, so a process or thread still
    finishing one after the rename would write into the next test's tables (seen once, when every copy was
    recycled: a worker process's lease hand-back deleting another test's leases). So a test that started a process
    (counted by an audit hook, whatever started it), or that left a thread running, has its copy dropped.
    """

    REUSES = 25
    """How many tests one copy serves at most (deleted rows leave dead tuples behind until autovacuum comes)."""

    def __init__(self, url: str, template: Template) -> None:
        self._url = url
        self._template = template
        self._ready: list[str] = []
        self._uses: dict[str, int] = {}

    def take(self) -> Lent:
        """A schema no other test has had under its name, with the template's structure, rows and sequences."""
        lent = Lent(schema="", processes=_started[0], threads=frozenset(threading.enumerate()))
        if self._ready:
            return attrs.evolve(lent, schema=self._ready.pop())
        schema = new_schema()
        clone_schema(self._url, self._template.copy, schema)
        self._uses[schema] = 0
        return attrs.evolve(lent, schema=schema)

    def give_back(self, lent: Lent) -> None:
        schema = lent.schema
        uses = self._uses.pop(schema, 0) + 1
        alone = _started[0] == lent.processes and not (set(threading.enumerate()) - lent.threads)
        renamed = new_schema()
        try:
            recycled = alone and uses < self.REUSES and recycle_schema(self._url, self._template, schema, renamed)
        except psycopg.Error:
            recycled = False
        if recycled:
            self._uses[renamed] = uses
            self._ready.append(renamed)
        else:
            drop_schema(self._url, schema)

    def close(self) -> None:
        while self._ready:
            drop_schema(self._url, self._ready.pop())


@pytest.fixture(scope="session")
def schema_pool(database_url: str, schema_template: Template) -> Iterator[SchemaPool]:
    pool = SchemaPool(database_url, schema_template)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def fresh_schema(schema_pool: SchemaPool) -> Iterator[str]:
    """A schema under a name of its own with every migration of the store and IAM applied: a copy of the template,
    or an earlier test's copy reset to the template (``SchemaPool``). Dropped or reset after the test."""
    lent = schema_pool.take()
    yield lent.schema
    schema_pool.give_back(lent)


@pytest.fixture
def empty_schema(database_url: str) -> Iterator[str]:
    """A unique schema name with nothing in it, for tests of the migrations; dropped after, if anything made it."""
    schema = new_schema()
    yield schema
    drop_schema(database_url, schema)


@pytest.fixture
async def pg_store(database_url: str, fresh_schema: str) -> AsyncIterator[PgStore]:
    """An open ``PgStore`` on a fresh schema, with the store's own tables installed (``install()`` finds them)."""
    store = PgStore(database_url, schema=fresh_schema, pool_size=4)
    await store.open()
    try:
        await store.install()
        yield store
    finally:
        await store.close()


@attrs.frozen(kw_only=True)
class Plane:
    compute: BetterCompute
    iam: EmbeddedIam
    store: PgStore
    root: str
    http: httpx.AsyncClient


@pytest.fixture
async def plane(database_url: str, fresh_schema: str) -> AsyncIterator[Plane]:
    store = PgStore(database_url, schema=fresh_schema, pool_size=4)
    iam = EmbeddedIam()
    compute = better_compute(Options(store=store, iam=iam, instance="test-1"))
    await compute.initialize()
    boot = await iam.bootstrap()
    assert boot.credential is not None
    transport = httpx.ASGITransport(app=compute.asgi)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield Plane(compute=compute, iam=iam, store=store, root=boot.credential, http=http)
    finally:
        await compute.close()
