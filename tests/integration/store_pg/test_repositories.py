"""Repositories bound to a transaction: ``tx.repository(KEY)`` reads the transaction's own writes and its writes
commit or roll back with it; ``store.repository(KEY)`` runs each call on its own and refuses the methods that need a
transaction; the bound adapter is made once per transaction and shares the store's statements."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bettercompute.errors import InternalError
from bettercompute.modules.commands import COMMANDS
from bettercompute.modules.nodes import CERTIFICATES, JOIN_KEYS, JOIN_TOKENS, NODES, CaKey
from bettercompute.modules.pools import POOLS
from bettercompute.modules.secrets import SECRETS, SecretRecord
from bettercompute.modules.usage import BOOKINGS, USAGE_RECORDS
from bettercompute.modules.webhooks import WEBHOOKS
from bettercompute.ports import WORKFLOWS, WorkflowRecord
from bettercompute_store_pg import PgStore

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

NOW = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


class _Boom(Exception):
    pass


async def _create_pool(store: PgStore, pool_id: str) -> None:
    async with store.transaction() as tx:
        await tx.repository(POOLS).create(
            id=pool_id, tenant="acme", name=pool_id, pool_class="gpu", acceptance_checks=(), labels={}
        )


async def test_a_write_through_the_transaction_rolls_back_with_it(pg_store: PgStore) -> None:
    with pytest.raises(_Boom):
        async with pg_store.transaction() as tx:
            await tx.repository(POOLS).create(
                id="pool_gone", tenant="acme", name="gone", pool_class="gpu", acceptance_checks=(), labels={}
            )
            assert await tx.repository(POOLS).get("pool_gone") is not None
            raise _Boom
    assert await pg_store.repository(POOLS).get("pool_gone") is None
    assert await pg_store.repository(POOLS).for_tenant("acme", after=None, limit=10) == []


async def test_a_method_allowed_outside_a_transaction_joins_the_transaction_when_bound(pg_store: PgStore) -> None:
    # create_if_none commits on its own through the store; through tx.repository it is part of the transaction.
    with pytest.raises(_Boom):
        async with pg_store.transaction() as tx:
            made = await tx.repository(JOIN_KEYS).create_if_none(id="jk_1", public_key="pk", sealed_key=b"sealed")
            assert made.id == "jk_1"
            raise _Boom
    assert await pg_store.repository(JOIN_KEYS).active() is None


async def test_the_transaction_reads_its_own_write_and_the_store_does_not_until_it_commits(pg_store: PgStore) -> None:
    async with pg_store.transaction() as tx:
        made = await tx.repository(POOLS).create(
            id="pool_new", tenant="acme", name="new", pool_class="gpu", acceptance_checks=("diag.nvml",), labels={}
        )
        assert await tx.repository(POOLS).get("pool_new") == made
        assert [p.id for p in await tx.repository(POOLS).for_tenant("acme", after=None, limit=10)] == ["pool_new"]
        # The store's adapter runs on another pooled connection, outside this transaction.
        assert await pg_store.repository(POOLS).get("pool_new") is None
        assert await pg_store.repository(POOLS).for_tenant("acme", after=None, limit=10) == []
    assert await pg_store.repository(POOLS).get("pool_new") == made


def _ca_key() -> CaKey:
    return CaKey(
        id="cak_1",
        trust_domain="example.org",
        algorithm="ec-p256",
        sealed_key=b"sealed",
        certificate_pem="-----BEGIN CERTIFICATE-----",
        state="active",
        not_after=NOW,
        created_at=NOW,
    )


def _workflow() -> WorkflowRecord:
    return WorkflowRecord(
        id="wf-1", type="probe", tenant="acme", subject="", state="running", step_index=0, step="first", attempt=1
    )


# Every method that needs a transaction, one call each (arguments as a caller would give them).
TRANSACTION_ONLY: dict[str, Callable[[PgStore], Awaitable[Any]]] = {
    "pools.create": lambda s: s.repository(POOLS).create(
        id="pool_x", tenant="acme", name="x", pool_class="gpu", acceptance_checks=(), labels={}
    ),
    "pools.update": lambda s: s.repository(POOLS).update(id="pool_a", name="renamed"),
    "join_tokens.create": lambda s: s.repository(JOIN_TOKENS).create(
        id="jt_x",
        pool_id="pool_a",
        tenant="acme",
        secret_hash=b"h" * 32,
        uses=1,
        expires_at=NOW,
        expect={},
        reclaim="never",
        created_by=None,
    ),
    "join_tokens.revoke": lambda s: s.repository(JOIN_TOKENS).revoke("jt_x"),
    "join_tokens.consume": lambda s: s.repository(JOIN_TOKENS).consume(id="jt_x", secret_hash=b"h" * 32, now=NOW),
    "nodes.enroll": lambda s: s.repository(NODES).enroll(
        new_id="node_x",
        pool_id="pool_a",
        tenant="acme",
        hardware_key="hk",
        claims={},
        attestation={},
        join_token_id="jt_x",
        reclaim=False,
    ),
    "nodes.get(lock=True)": lambda s: s.repository(NODES).get("node_x", lock=True),
    "nodes.retire": lambda s: s.repository(NODES).retire("node_x"),
    "certificates.lock": lambda s: s.repository(CERTIFICATES).lock("example.org"),
    "certificates.lock_identity": lambda s: s.repository(CERTIFICATES).lock_identity(
        "spiffe://example.org/node/x", shared=True
    ),
    "certificates.add_key": lambda s: s.repository(CERTIFICATES).add_key(_ca_key()),
    "certificates.set_key_state": lambda s: s.repository(CERTIFICATES).set_key_state(
        trust_domain="example.org", id="cak_1", state="retired"
    ),
    "certificates.revoke": lambda s: s.repository(CERTIFICATES).revoke(serial="ab", reason="test"),
    "commands.create": lambda s: s.repository(COMMANDS).create(
        id="cmd_x",
        node_id="node_x",
        tenant="acme",
        kind="diag.nvml",
        payload={},
        deadline=NOW,
        on_session_loss="fail",
        max_attempts=1,
    ),
    "commands.expire": lambda s: s.repository(COMMANDS).expire(now=NOW, limit=10),
    "commands.orphaned": lambda s: s.repository(COMMANDS).orphaned(stale_before=NOW, now=NOW, limit=10),
    "secrets.create": lambda s: s.repository(SECRETS).create(
        SecretRecord(
            id="sec_x", tenant="acme", name="x", scope="pool:pool_a", description="", sealed_value=b"v", created_at=NOW
        )
    ),
    "secrets.delete": lambda s: s.repository(SECRETS).delete(tenant="acme", name="x"),
    "bookings.book": lambda s: s.repository(BOOKINGS).book(
        atom_id="atom_x", reservation_id="r-1", tenant="acme", pool_id="pool_a", gpus=1.0, start=NOW, end=None
    ),
    "bookings.release": lambda s: s.repository(BOOKINGS).release(reservation_id="r-1", at=NOW),
    "usage.accounted_until": lambda s: s.repository(USAGE_RECORDS).accounted_until(),
    "usage.earliest_booking": lambda s: s.repository(USAGE_RECORDS).earliest_booking(),
    "usage.account": lambda s: s.repository(USAGE_RECORDS).account(
        start=NOW, end=NOW + dt.timedelta(hours=1), period=dt.timedelta(hours=1)
    ),
    "webhooks.create": lambda s: s.repository(WEBHOOKS).create(
        id="wh_x", tenant="acme", url="https://example.org/hook", event_types=(), description="", sealed_secret=b"s"
    ),
    "webhooks.delete": lambda s: s.repository(WEBHOOKS).delete(tenant="acme", id="wh_x"),
    "webhooks.add_delivery": lambda s: s.repository(WEBHOOKS).add_delivery(
        tenant="acme", id="wh_x", event_id="evt_1", event_type="t", event_key="k", body="{}"
    ),
    "workflows.insert": lambda s: s.repository(WORKFLOWS).insert(_workflow()),
    "workflows.lock": lambda s: s.repository(WORKFLOWS).lock("wf-1"),
    "workflows.update": lambda s: s.repository(WORKFLOWS).update(_workflow()),
    "workflows.log": lambda s: s.repository(WORKFLOWS).log(
        workflow_id="wf-1", step_index=0, step="first", attempt=1, outcome="next", reason=None
    ),
}


@pytest.mark.parametrize("call", list(TRANSACTION_ONLY))
async def test_a_transaction_only_method_on_the_store_is_refused_before_any_statement(
    pg_store: PgStore, call: str
) -> None:
    await _create_pool(pg_store, "pool_a")
    before = pg_store.pool_usage.checkouts
    with pytest.raises(InternalError, match=r"needs a transaction: use tx\.repository\(\.\.\.\)"):
        await TRANSACTION_ONLY[call](pg_store)
    assert pg_store.pool_usage.checkouts == before  # refused before any connection was taken
    # Nothing was written (the pool keeps its name: an update did not slip through either).
    pool = await pg_store.repository(POOLS).get("pool_a")
    assert pool is not None and pool.name == "pool_a"
    assert await pg_store.repository(POOLS).get("pool_x") is None


async def test_reads_run_on_the_store_outside_a_transaction(pg_store: PgStore) -> None:
    await _create_pool(pg_store, "pool_a")
    nodes = pg_store.repository(NODES)
    assert await nodes.get("node_x") is None  # without lock: a read on its own
    assert await pg_store.repository(CERTIFICATES).keys("example.org") == []
    assert await pg_store.repository(USAGE_RECORDS).records(tenant="acme", since=NOW, until=NOW) == []


async def test_the_bound_adapter_is_made_once_per_transaction_and_shares_the_statements(pg_store: PgStore) -> None:
    store_pools = pg_store.repository(POOLS)
    assert pg_store.repository(POOLS) is store_pools
    async with pg_store.transaction() as first:
        bound = first.repository(POOLS)
        assert first.repository(POOLS) is bound
        assert bound is not store_pools
        tokens: object = first.repository(JOIN_TOKENS)
        assert tokens is not bound and first.repository(JOIN_TOKENS) is tokens
        # A copy bound to the connection, with the statements built once for the store, not again.
        assert vars(bound).keys() - vars(store_pools).keys() == {"_connection"}
        assert all(vars(bound)[name] is value for name, value in vars(store_pools).items())
    async with pg_store.transaction() as second:
        again = second.repository(POOLS)
        assert again is not bound
        assert second.repository(POOLS) is again
    assert pg_store.repository(POOLS) is store_pools
