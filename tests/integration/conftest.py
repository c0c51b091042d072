"""Fixtures for tests against PostgreSQL: a fresh, migrated store per test, in a schema of its own.

A test's schema is a copy of one migrated once per session (``_template.py``), not migrated again: ``initialize()``
and ``install()`` find every migration recorded and apply nothing. Tests of the migrations themselves take
``empty_schema``.
"""

from __future__ import annotations

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

from ._template import clone_schema, copy_script, migrate_template


def new_schema() -> str:
    """A schema name no other test uses."""
    return f"bc_t_{uuid.uuid4().hex[:12]}"


def drop_schema(url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it (a plain connection, so teardown does not depend on the store)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(scope="session")
def schema_copy_script(database_url: str) -> Iterator[str]:
    """The SQL that copies a schema migrated once for the session (the template is dropped when it ends)."""
    template = new_schema()
    try:
        anyio.run(migrate_template, database_url, template)
        yield copy_script(database_url, template)
    finally:
        drop_schema(database_url, template)


@pytest.fixture
def fresh_schema(database_url: str, schema_copy_script: str) -> Iterator[str]:
    """A unique schema with every migration of the store and IAM applied (a copy of the template), dropped after."""
    schema = new_schema()
    clone_schema(database_url, schema_copy_script, schema)
    yield schema
    drop_schema(database_url, schema)


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
