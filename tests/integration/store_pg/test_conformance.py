"""``PgStore`` against the store conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bettercompute.ports import Store
from bettercompute.testing import StoreConformance
from bettercompute_store_pg import PgStore


def _is_a_store(store: PgStore) -> Store:
    # mypy checks here that PgStore satisfies the Store protocol structurally.
    return store


class TestPgStore(StoreConformance):
    @pytest.fixture
    async def store(self, pg_store: PgStore) -> AsyncIterator[Store]:
        yield _is_a_store(pg_store)
