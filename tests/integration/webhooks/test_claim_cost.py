"""What one tenant's backlog costs everyone else's claims: the fair claim reads a bounded number of pages, however
many deliveries one subscription has waiting.

Counted in buffers (pages PostgreSQL touched), not in time: with the old global due index the planner walked every
pending row once per subscription: one tenant's backlog cost every pass of every tenant about one full read of the
deliveries per subscription (50,000 deliveries and 50 subscriptions: 44,000 pages and a second, against 1,600 pages
and 8 ms now).
"""

from __future__ import annotations

import json
import re
from typing import Any

import psycopg
import pytest

from bettercompute_store_pg import PgStore
from bettercompute_store_pg._schema import quote_schema
from bettercompute_store_pg.modules.webhooks._repository import _CLAIM

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

BACKLOG = 20_000
SUBSCRIPTIONS = 50


def _pages(url: str, schema: str) -> int:
    """Pages one claim touches, run for real under EXPLAIN ANALYZE and rolled back."""
    params = {"per_webhook": 8, "per_tenant": 16, "limit": 100, "claim_for": "1 minute"}
    sql = re.sub(r"(?<!:):(\w+)", r"%(\1)s", _CLAIM.replace("{s}", quote_schema(schema)))
    with psycopg.connect(url) as conn:
        [[plan]] = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params).fetchall()
        conn.rollback()
    tree: Any = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(tree["Shared Hit Blocks"]) + int(tree["Shared Read Blocks"])


async def test_one_subscriptions_backlog_does_not_grow_every_claim(
    pg_store: PgStore, database_url: str, fresh_schema: str
) -> None:
    schema = fresh_schema
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".webhook_subscriptions (id, tenant, url, sealed_secret)'
            " SELECT 'wh_' || g, 'tenant-' || (g %% 10), 'https://hooks.example.com/', ''::bytea"
            " FROM generate_series(1, %s) AS g",
            (SUBSCRIPTIONS,),
        )
        conn.execute(
            f'INSERT INTO "{schema}".webhook_deliveries (subscription_id, event_id, event_type, event_key, body)'
            " SELECT 'wh_1', 'ev_' || g, 'test', 'key-' || g, '{}' FROM generate_series(1, %s) AS g",
            (BACKLOG,),
        )
        conn.execute(
            f'INSERT INTO "{schema}".webhook_deliveries (subscription_id, event_id, event_type, event_key, body)'
            " SELECT 'wh_' || g, 'ev_x', 'test', 'key-x', '{}' FROM generate_series(2, %s) AS g",
            (SUBSCRIPTIONS,),
        )
        conn.execute(f'ANALYZE "{schema}".webhook_deliveries')
        conn.execute(f'ANALYZE "{schema}".webhook_subscriptions')
        [[table_pages]] = conn.execute(f"SELECT pg_relation_size('\"{schema}\".webhook_deliveries') / 8192").fetchall()
    pages = _pages(database_url, schema)
    # The planner may read the table (and its indexes) a few times where that is cheaper than probing, but never once
    # per subscription (the old plan: about SUBSCRIPTIONS times the table).
    assert pages < 15 * table_pages, (pages, table_pages)
