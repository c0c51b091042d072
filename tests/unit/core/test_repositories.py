"""A module reaches its repository by a typed key; the PostgreSQL store finds the adapter by the module's name (or in
the Python module the key names for a module of another package), and ``better_compute()`` refuses a module whose
repository the store does not ship."""

from __future__ import annotations

from typing import Any

import pytest

from bettercompute._runtime.declarations import StaticModule
from bettercompute.errors import InternalError, InvalidConfigError
from bettercompute.modules.nodes import JOIN_TOKENS
from bettercompute.modules.pools import POOLS, Pools
from bettercompute.ports import WORKFLOWS, Repository
from bettercompute_iam._pg import IAM_ADMIN, IamAdmin
from bettercompute_store_pg import Database, PgRepository, PgStore
from bettercompute_store_pg._workflows import PgWorkflows
from bettercompute_store_pg.modules.nodes._join_tokens import PgJoinTokens
from bettercompute_store_pg.modules.pools._repository import PgPools
from examples.maintenance._pg import PgWindows
from examples.maintenance._port import MAINTENANCE

from .conftest import UNREACHABLE, make_compute


class _Plain:
    """Not a PgRepository: the store refuses it as an adapter."""

    def __init__(self, db: Database) -> None:
        self.db = db


class _Adapter(PgRepository):
    pass


REPOSITORIES: dict[str, Any] = {"plain": _Plain, "adapter": _Adapter}
"""This test module stands for another package's adapters (``Repository.adapters``)."""


def test_a_key_finds_its_adapter_once_per_store() -> None:
    store = PgStore(UNREACHABLE)
    pools: Pools = store.repository(POOLS)
    assert isinstance(pools, PgPools) and store.repository(POOLS) is pools
    assert isinstance(store.repository(JOIN_TOKENS), PgJoinTokens)


@pytest.mark.parametrize(
    ("module", "name"),
    [("pools", "widgets"), ("widgets", "widgets"), ("../pools", "pools"), ("pools._repository", "pools"), ("", "x")],
)
def test_an_unknown_repository_is_a_configuration_error(module: str, name: str) -> None:
    key: Repository[Any] = Repository(module=module, name=name)
    with pytest.raises(InvalidConfigError) as refused:
        PgStore(UNREACHABLE).repository(key)
    assert "no repository" in refused.value.message


def test_a_module_needing_a_repository_the_store_lacks_is_refused() -> None:
    key: Repository[Any] = Repository(module="widgets", name="widgets")
    module = StaticModule(name="widgets", version="1.0", core_range=">=0.1", repositories=(key,))
    with pytest.raises(InvalidConfigError) as refused:
        make_compute(modules=[module])
    assert refused.value.details["problems"] == [
        "store: PgStore has no repository widgets.widgets (needed by module 'widgets')"
    ]


def test_a_key_of_another_package_finds_the_adapters_it_names() -> None:
    store = PgStore(UNREACHABLE)
    assert isinstance(store.repository(MAINTENANCE), PgWindows)
    assert isinstance(store.repository(IAM_ADMIN), IamAdmin)
    assert isinstance(store.repository(WORKFLOWS), PgWorkflows)  # the runtime's, under the module name "runtime"
    key: Repository[_Adapter] = Repository(module="widgets", name="adapter", adapters={"postgresql": __name__})
    assert isinstance(store.repository(key), _Adapter) and store.repository(key) is store.repository(key)
    assert key == Repository(module="widgets", name="adapter")  # where to find it is no part of the key


# "" falls back to the store's own place (bettercompute_store_pg.modules.maintenance), which ships nothing.
@pytest.mark.parametrize("where", ["examples.maintenance._nowhere", "../examples", "examples..maintenance", ""])
def test_a_key_naming_no_adapters_is_a_configuration_error(where: str) -> None:
    key: Repository[Any] = Repository(module="maintenance", name="windows", adapters={"postgresql": where})
    with pytest.raises(InvalidConfigError) as refused:
        PgStore(UNREACHABLE).repository(key)
    assert "no repository" in refused.value.message


def test_an_adapter_that_is_no_pg_repository_is_refused() -> None:
    key: Repository[Any] = Repository(module="widgets", name="plain", adapters={"postgresql": __name__})
    with pytest.raises(InternalError, match="not a PgRepository"):
        PgStore(UNREACHABLE).repository(key)
