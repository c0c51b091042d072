"""Retention: finished deliveries leave the log after their retention (a week delivered, a month dead by default),
in bounded batches; a pending delivery stays whatever its age."""

from __future__ import annotations

import datetime as dt

import pytest

from bettercompute.modules.webhooks import WEBHOOKS, ListDeliveriesInput

from .conftest import Hooks

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

DAY = dt.timedelta(days=1)
URL = "http://127.0.0.1:9/hook"  # never called: no delivery below is due

# A row as the sender leaves it, aged: created and finished that long ago (a pending one is due tomorrow).
_INSERT = """
INSERT INTO {s}.webhook_deliveries
    (subscription_id, event_id, event_type, event_key, body, status, attempts, next_attempt_at, created_at, finished_at)
VALUES (:subscription_id, :event_id, 'node.changed', 'node_1', '{}', :status, :attempts,
    CASE WHEN :status = 'pending' THEN now() + interval '1 day' END, now() - CAST(:created_ago AS interval),
    now() - CAST(:finished_ago AS interval))
RETURNING id
"""


async def _add(hooks: Hooks, webhook_id: str, event_id: str, status: str, age: dt.timedelta) -> None:
    finished_ago = None if status == "pending" else age
    params = {
        "subscription_id": webhook_id,
        "event_id": event_id,
        "status": status,
        "attempts": 0 if status == "delivered" else 3,
        "created_ago": age + dt.timedelta(minutes=5),
        "finished_ago": finished_ago,
    }
    await hooks.store.fetch(hooks.store.sql(_INSERT), params)


async def _log(hooks: Hooks, webhook_id: str) -> dict[str, str]:
    log = await hooks.api.deliveries(hooks.alice, ListDeliveriesInput(tenant=hooks.acme, id=webhook_id, limit=200))
    return {d.event_id: d.status for d in log.deliveries}


async def test_the_retention_job_deletes_finished_deliveries_past_their_retention(hooks: Hooks) -> None:
    webhook_id, _ = await hooks.subscribe(URL)
    rows = [
        ("evt_pending_90d", "pending", 90 * DAY),
        ("evt_dead_31d", "dead", 31 * DAY),
        ("evt_dead_29d", "dead", 29 * DAY),
        ("evt_delivered_8d", "delivered", 8 * DAY),
        ("evt_delivered_6d", "delivered", 6 * DAY),
        ("evt_delivered_now", "delivered", dt.timedelta(seconds=1)),
    ]
    for event_id, status, age in rows:
        await _add(hooks, webhook_id, event_id, status, age)

    done = await hooks.compute.jobs.tick({"sinks"})

    assert done["sinks/webhooks-retention"] == 2
    assert await _log(hooks, webhook_id) == {
        "evt_pending_90d": "pending",  # never deleted, whatever its age
        "evt_dead_29d": "dead",  # a dead letter is kept 30 days, longer than a delivered one
        "evt_delivered_6d": "delivered",
        "evt_delivered_now": "delivered",
    }
    assert (await hooks.compute.jobs.tick({"sinks"}))["sinks/webhooks-retention"] == 0


async def test_a_purge_walks_the_whole_log_in_small_batches(hooks: Hooks) -> None:
    """Kept rows first, due ones after and between them: a purge of two rows per statement still finds them all,
    and stops at the rows made within the retention."""
    webhook_id, _ = await hooks.subscribe(URL)
    kept: dict[str, str] = {}
    for n in range(5):
        await _add(hooks, webhook_id, f"evt_dead_kept_{n}", "dead", 20 * DAY)
        kept[f"evt_dead_kept_{n}"] = "dead"
    for n in range(7):
        await _add(hooks, webhook_id, f"evt_old_{n}", "delivered" if n % 2 else "dead", 40 * DAY)
        if n == 3:
            await _add(hooks, webhook_id, "evt_pending_old", "pending", 40 * DAY)
            kept["evt_pending_old"] = "pending"
    for n in range(5):
        await _add(hooks, webhook_id, f"evt_recent_{n}", "delivered", dt.timedelta(minutes=1))
        kept[f"evt_recent_{n}"] = "delivered"

    purged = await hooks.store.repository(WEBHOOKS).purge(retention=7 * DAY, dead_retention=30 * DAY, batch=2)

    assert purged == 7
    assert await _log(hooks, webhook_id) == kept
    assert await hooks.store.repository(WEBHOOKS).purge(retention=7 * DAY, dead_retention=30 * DAY, batch=2) == 0
