"""Migrations per module name, and a migration that adopts another module's step."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from bettercompute import JoinSettings, Options, better_compute
from bettercompute.errors import InvalidConfigError
from bettercompute.modules.nodes import CreateJoinTokenInput, JoinTokensGroup
from bettercompute.modules.pools import CreatePoolInput, PoolsGroup
from bettercompute.ports import Migration
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

from .._template import fingerprint, migrate_template
from ..iam.conftest import two_tenants

pytestmark = pytest.mark.anyio

# Every name a schema migrated with the built-in modules records, besides IAM's (``reservations`` and ``inventory``
# have no migrations of their own: their tables were made by ``capacity``'s and ``nodes``').
STORE_MODULES = (
    "runtime",
    "pools",
    "images",
    "commands",
    "usage",
    "capacity",
    "webhooks",
    "secrets",
    "nodes",
    "audit",
)
NODE_KEYS = [
    ("atoms", "atoms_node_id_fkey", "FOREIGN KEY (node_id) REFERENCES <schema>.nodes(id)"),
    ("commands", "commands_node_id_fkey", "FOREIGN KEY (node_id) REFERENCES <schema>.nodes(id)"),
    ("devices", "devices_node_id_fkey", "FOREIGN KEY (node_id) REFERENCES <schema>.nodes(id)"),
    ("node_conditions", "node_conditions_node_id_fkey", "FOREIGN KEY (node_id) REFERENCES <schema>.nodes(id)"),
    ("node_inventory", "node_inventory_node_id_fkey", "FOREIGN KEY (node_id) REFERENCES <schema>.nodes(id)"),
    ("sessions", "sessions_node_id_fkey", "FOREIGN KEY (node_id) REFERENCES <schema>.nodes(id)"),
    ("tunnels", "tunnels_node_id_fkey", "FOREIGN KEY (node_id) REFERENCES <schema>.nodes(id)"),
]


def _recorded(url: str, schema: str) -> list[tuple[str, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(f'SELECT module, version FROM "{schema}".schema_migrations ORDER BY module, version')
        return [(module, version) for module, version in rows]


def _node_keys(url: str, schema: str) -> list[tuple[str, ...]]:
    found = fingerprint(url, schema)["constraints"]
    return [
        (table, name, definition)
        for table, name, kind, definition, *_ in found
        if kind == "f" and "nodes" in definition
    ]


async def test_a_fresh_schema_records_each_module_and_never_core(database_url: str, empty_schema: str) -> None:
    await migrate_template(database_url, empty_schema)
    modules = {module for module, _ in _recorded(database_url, empty_schema)}
    assert modules == {*STORE_MODULES, "iam"}
    assert "core" not in modules


async def test_migrating_twice_applies_nothing(database_url: str, empty_schema: str) -> None:
    store = PgStore(database_url, schema=empty_schema, pool_size=2)
    compute = better_compute(Options(store=store, iam=EmbeddedIam()))
    try:
        first = await compute.migrate()
        assert first["runtime"] == [1] and first["pools"] == [1, 2] and first["iam"]
        # The system module ("core") has no tables; every built-in module's are made, with a KMS or without.
        assert "core" not in first and set(first) == {*STORE_MODULES, "iam"}
        second = await compute.migrate()
        assert second.keys() == first.keys()
        assert all(applied == [] for applied in second.values()), second
        assert await store.install() == []
    finally:
        await compute.close()


async def test_a_module_finds_its_store_migrations_by_name() -> None:
    store = PgStore("postgresql://nobody@127.0.0.1:1/none")
    for name in ("pools", "commands", "usage", "webhooks", "secrets", "nodes"):
        shipped = store.migrations(name)
        assert [m.version for m in shipped] == list(range(1, len(shipped) + 1))
        assert all(m.adopts is None for m in shipped)
    assert [(m.version, m.adopts) for m in store.migrations("capacity")] == [(1, None), (2, None), (3, None), (4, None)]
    # The runtime is install()'s, never a module's; names the store ships nothing for get nothing.
    for name in ("runtime", "core", "iam", "metal", "no-such", "../pools", "Pools"):
        assert store.migrations(name) == ()
    assert [m.version for m in PgStore.runtime_migrations()] == [1]


async def test_a_migration_may_not_adopt_its_own_module(database_url: str, empty_schema: str) -> None:
    async with PgStore(database_url, schema=empty_schema, pool_size=1) as store:
        steps = [Migration(version=1, name="self", sql="SELECT 1", adopts=("probe", 1))]
        with pytest.raises(InvalidConfigError, match="invalid") as refused:
            await store.migrate("probe", steps)
        assert refused.value.details["problems"][0]["problem"] == "adopts its own module"


async def test_an_adopting_migration_runs_where_what_it_adopts_is_not_recorded(
    database_url: str, empty_schema: str
) -> None:
    async with PgStore(database_url, schema=empty_schema, pool_size=1) as store:
        make = Migration(version=1, name="t", sql="CREATE TABLE {schema}.t (id integer)", adopts=("old", 3))
        assert await store.migrate("new", [make]) == [1]
        assert await store.migrate("old", [Migration(version=3, name="o", sql="SELECT 1")]) == [3]
        # Recorded once "old" 3 is: the table is not made a second time (which would fail).
        again = Migration(version=1, name="t", sql="CREATE TABLE {schema}.t (id integer)", adopts=("old", 3))
        assert await store.migrate("newer", [again]) == [1]
    assert ("newer", 1) in _recorded(database_url, empty_schema)


@pytest.mark.parametrize("nodes_first", [False, True])
async def test_commands_and_nodes_get_their_keys_in_either_order(
    database_url: str, empty_schema: str, nodes_first: bool
) -> None:
    async with PgStore(database_url, schema=empty_schema, pool_size=1) as store:
        await store.install()
        order = ("pools", "nodes", "commands") if nodes_first else ("pools", "commands", "nodes")
        for module in order:
            await store.migrate(module, store.migrations(module))
            if module == "commands" and not nodes_first:
                assert _node_keys(database_url, empty_schema) == []  # no nodes table yet, so no key to it
    assert _node_keys(database_url, empty_schema) == NODE_KEYS


async def test_join_settings_without_a_kms_give_a_join_command_without_pins(
    database_url: str, empty_schema: str
) -> None:
    # Migrated from nothing: the nodes module's tables are there, but no CA and no JoinService key is ever made.
    join = JoinSettings(gateway_address="gw.example.com:443", trust_domain="example.com")
    async with two_tenants(database_url, empty_schema, join=join) as t:
        assert "nodes" in {m for m, _ in _recorded(database_url, empty_schema)}
        pools: PoolsGroup[Any] = t.compute.api.group(PoolsGroup)
        tokens: JoinTokensGroup[Any] = t.compute.api.group(JoinTokensGroup)
        pool = await pools.create(t.alice, CreatePoolInput(tenant=t.acme, name="gpus"))
        created = await tokens.create(t.alice, CreateJoinTokenInput(pool_id=pool.id, uses=1, expires_in_seconds=60))
        assert "--gateway gw.example.com:443 --trust-domain example.com" in created.join_command
        assert "--ca-bundle" not in created.join_command


async def test_a_renamed_module_takes_over_the_versions_recorded_under_its_old_name(
    database_url: str, empty_schema: str
) -> None:
    # A database older code migrated: the nodes module's history is recorded under its old name, "identity".
    await migrate_template(database_url, empty_schema)
    with psycopg.connect(database_url) as conn:
        conn.execute(f"UPDATE \"{empty_schema}\".schema_migrations SET module = 'identity' WHERE module = 'nodes'")
    old = [v for m, v in _recorded(database_url, empty_schema) if m == "identity"]
    assert old, "the nodes module recorded nothing to rename"
    async with PgStore(database_url, schema=empty_schema, pool_size=1) as store:
        # Nothing runs again (running version 1 again would fail on its tables), and the history is carried over.
        assert await store.migrate("nodes", store.migrations("nodes")) == []
    recorded = _recorded(database_url, empty_schema)
    assert [v for m, v in recorded if m == "nodes"] == old
    # The old name's rows stay, for older code running beside this one during a rolling upgrade.
    assert [v for m, v in recorded if m == "identity"] == old
