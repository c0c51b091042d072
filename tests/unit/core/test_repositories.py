"""A module reaches its repository by a typed key; the PostgreSQL store finds the adapter by the module's name, and
``better_compute()`` refuses a module whose repository the store does not ship."""

from __future__ import annotations

from typing import Any

import pytest

from bettercompute._runtime.declarations import StaticModule
from bettercompute.errors import InvalidConfigError
from bettercompute.modules.pools import JOIN_TOKENS, POOLS, Pools
from bettercompute.ports import Repository
from bettercompute_store_pg import PgStore
from bettercompute_store_pg.modules.pools._repository import PgJoinTokens, PgPools

from .conftest import UNREACHABLE, make_compute


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
