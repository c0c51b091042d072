"""``PgStore`` through PgBouncer in transaction mode, with prepared statements off: the conformance suite again.

The test starts its own PgBouncer (Debian package ``pgbouncer``) on a free loopback port. Without the binary the
tests are skipped, except in CI (``CI`` set), where a missing binary is a failure.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from bettercompute.ports import Store, WorkItem
from bettercompute.testing import StoreConformance
from bettercompute_store_pg import PgStore

from .._pgbouncer import running_pgbouncer


@pytest.fixture(scope="module")
def pgbouncer_url(database_url: str) -> Iterator[str]:
    """A ``postgresql://`` URL through a PgBouncer in transaction mode in front of the test database, with fewer
    server connections than the store has clients, so clients keep switching server connections."""
    with running_pgbouncer(database_url, pool_size=2) as url:
        yield url


class TestPgStoreThroughPgBouncer(StoreConformance):
    @pytest.fixture
    async def store(self, pgbouncer_url: str, fresh_schema: str) -> AsyncIterator[Store]:
        # A migrated copy, as everywhere: install() through the pooler finds every migration recorded.
        store = PgStore(pgbouncer_url, schema=fresh_schema, pool_size=4, prepared_statements=False)
        await store.open()
        try:
            assert await store.install() == []
            yield store
        finally:
            await store.close()

    async def test_a_fresh_schema_migrates_through_the_pooler(self, pgbouncer_url: str, empty_schema: str) -> None:
        # Every migration from nothing, as a first deployment behind PgBouncer runs them.
        store = PgStore(pgbouncer_url, schema=empty_schema, pool_size=2, prepared_statements=False)
        await store.open()
        try:
            assert await store.install() == [m.version for m in PgStore.runtime_migrations()]
            assert await store.install() == []
            await store.queue.enqueue([WorkItem(kind="k", key="first")])
            assert await store.queue.pending() == 1
        finally:
            await store.close()

    async def test_repeated_statements_stay_unprepared(self, store: Store) -> None:
        # psycopg prepares a statement on its 5th run unless told not to; through a transaction-mode pooler the
        # next run lands on a server connection that never saw it. Concurrent clients sharing two server
        # connections make that happen at once with prepared statements on.
        async def hammer() -> None:
            for _ in range(15):
                await store.ping()
                assert await store.queue.pending() == 0

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(hammer)
