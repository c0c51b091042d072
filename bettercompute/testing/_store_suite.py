"""``StoreConformance``: the behaviour every ``bettercompute.ports.Store`` promises, as pytest tests.

Subclass it in a test module and provide a ``store`` fixture (open, migrated with ``install()``, empty) and an
``anyio_backend`` fixture::

    class TestMyStore(StoreConformance):
        @pytest.fixture
        async def store(self) -> AsyncIterator[Store]: ...

Expiry is tested with real time: leases and claims of a few hundred milliseconds, and sleeps a little longer.

It includes the workflow store's cases (``WorkflowStoreConformance``): the repository ``WORKFLOWS`` is part of the
contract.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import anyio
import pytest

from bettercompute.errors import FailedPreconditionError, InvalidConfigError
from bettercompute.ports import Claim, Lease, Migration, OutboxEvent, Store, StoredEvent, WorkItem
from bettercompute.testing._workflow_suite import WorkflowStoreConformance

__all__ = ["StoreConformance"]

SHORT = dt.timedelta(milliseconds=300)
"""A lease or claim meant to expire during the test."""
PAST_SHORT = 0.6
"""Seconds to sleep for ``SHORT`` to be over, with room for a slow machine."""
LONG = dt.timedelta(minutes=5)
"""A lease or claim meant to outlive the test."""
NO_DELAY = dt.timedelta(0)


def _keys(items: Sequence[Claim | StoredEvent]) -> list[str]:
    return [item.key for item in items]


@pytest.mark.anyio
class StoreConformance(WorkflowStoreConformance):
    """The store contract. Tests use only the ``Store`` protocol, so they run against any implementation."""

    probe_migrations: Sequence[Migration] = (
        Migration(version=1, name="probe table", sql="CREATE TABLE {schema}.conformance_probe (id integer)"),
        Migration(version=2, name="probe note", sql="ALTER TABLE {schema}.conformance_probe ADD COLUMN note text"),
    )
    """Two migrations for the store's dialect where the second fails unless the first ran before it."""

    probe_migration_3: Migration = Migration(
        version=3, name="probe index", sql="CREATE INDEX conformance_probe_id ON {schema}.conformance_probe (id)"
    )

    async def _claim(self, store: Store, kinds: Sequence[str] = ("k",), **kwargs: object) -> list[Claim]:
        options: dict[str, object] = {"holder": "worker-a", "limit": 10, "claim_for": LONG}
        options.update(kwargs)
        return await store.queue.claim(kinds=kinds, **options)  # type: ignore[arg-type]

    # --- basics -----------------------------------------------------------------------------------------------

    async def test_ping_and_database_clock(self, store: Store) -> None:
        await store.ping()
        now = await store.now()
        assert now.utcoffset() == dt.timedelta(0)
        assert abs(now - dt.datetime.now(dt.UTC)) < dt.timedelta(minutes=5)

    async def test_install_is_idempotent(self, store: Store) -> None:
        assert await store.install() == []

    # --- migrations -------------------------------------------------------------------------------------------

    async def test_migrations_run_once_in_version_order(self, store: Store) -> None:
        backwards = list(reversed(self.probe_migrations))
        assert await store.migrate("conformance", backwards) == [1, 2]
        assert await store.migrate("conformance", backwards) == []
        assert await store.migrate("conformance", [*backwards, self.probe_migration_3]) == [3]

    async def test_duplicate_migration_versions_are_refused(self, store: Store) -> None:
        first = self.probe_migrations[0]
        with pytest.raises(InvalidConfigError):
            await store.migrate("conformance", [first, Migration(version=first.version, name="again", sql=first.sql)])
        # Nothing was applied: the valid migrations still run afterwards.
        assert await store.migrate("conformance", self.probe_migrations) == [1, 2]

    async def test_renamed_migration_is_refused(self, store: Store) -> None:
        await store.migrate("conformance", self.probe_migrations)
        first, second = self.probe_migrations
        renamed = Migration(version=first.version, name=f"{first.name} (renamed)", sql=first.sql)
        with pytest.raises(InvalidConfigError):
            await store.migrate("conformance", [renamed, second])

    async def test_modules_have_separate_versions(self, store: Store) -> None:
        one = Migration(version=1, name="noop", sql="SELECT 1")
        assert await store.migrate("conformance-a", [one]) == [1]
        assert await store.migrate("conformance-b", [one]) == [1]

    # --- leases -----------------------------------------------------------------------------------------------

    async def test_lease_is_exclusive(self, store: Store) -> None:
        lease = await store.leases.acquire("job", "a", LONG)
        assert lease is not None
        assert (lease.name, lease.holder) == ("job", "a")
        assert lease.expires_at > await store.now()
        assert await store.leases.acquire("job", "b", LONG) is None
        assert await store.leases.get("job") == lease

    async def test_holder_reacquiring_keeps_the_token(self, store: Store) -> None:
        first = await store.leases.acquire("job", "a", SHORT)
        again = await store.leases.acquire("job", "a", LONG)
        assert first is not None and again is not None
        assert again.token == first.token
        assert again.expires_at > first.expires_at

    async def test_renew_extends_a_held_lease(self, store: Store) -> None:
        lease = await store.leases.acquire("job", "a", SHORT)
        assert lease is not None
        renewed = await store.leases.renew(lease, LONG)
        assert renewed is not None
        assert renewed.token == lease.token
        assert renewed.expires_at > lease.expires_at
        await anyio.sleep(PAST_SHORT)
        assert await store.leases.get("job") == renewed

    async def test_release_frees_the_lease_and_the_next_token_is_higher(self, store: Store) -> None:
        lease = await store.leases.acquire("job", "a", LONG)
        assert lease is not None
        assert await store.leases.release(lease) is True
        assert await store.leases.release(lease) is False
        assert await store.leases.get("job") is None
        assert await store.leases.renew(lease, LONG) is None
        taken = await store.leases.acquire("job", "b", LONG)
        assert taken is not None
        assert taken.token > lease.token

    async def test_holder_reacquiring_after_release_gets_a_new_token(self, store: Store) -> None:
        lease = await store.leases.acquire("job", "a", LONG)
        assert lease is not None
        await store.leases.release(lease)
        again = await store.leases.acquire("job", "a", LONG)
        assert again is not None
        assert again.token > lease.token

    async def test_expired_lease_passes_to_another_holder(self, store: Store) -> None:
        old = await store.leases.acquire("job", "a", SHORT)
        assert old is not None
        await anyio.sleep(PAST_SHORT)
        assert await store.leases.get("job") is None
        new = await store.leases.acquire("job", "b", LONG)
        assert new is not None
        assert new.token > old.token
        assert await store.leases.renew(old, LONG) is None
        assert await store.leases.release(old) is False
        assert await store.leases.get("job") == new

    async def test_leases_are_independent(self, store: Store) -> None:
        assert await store.leases.acquire("one", "a", LONG) is not None
        assert await store.leases.acquire("two", "b", LONG) is not None

    async def test_fenced_transaction_commits_with_a_held_lease(self, store: Store) -> None:
        lease = await store.leases.acquire("job", "a", LONG)
        assert lease is not None
        async with store.transaction(fence=lease) as tx:
            await tx.enqueue([WorkItem(kind="k", key="x")])
        assert await store.queue.pending() == 1

    async def test_fenced_transaction_refuses_a_stale_token(self, store: Store) -> None:
        old = await self._taken_over_lease(store)
        with pytest.raises(FailedPreconditionError):
            async with store.transaction(fence=old) as tx:
                await tx.enqueue([WorkItem(kind="k", key="x")])
                await tx.publish([OutboxEvent(type="t", key="x")])
        assert await store.queue.pending() == 0
        assert await store.outbox.claim(holder="a", limit=10, claim_for=LONG) == []

    async def test_fenced_transaction_refuses_a_released_lease(self, store: Store) -> None:
        lease = await store.leases.acquire("job", "a", LONG)
        assert lease is not None
        await store.leases.release(lease)
        with pytest.raises(FailedPreconditionError):
            async with store.transaction(fence=lease) as tx:
                await tx.enqueue([WorkItem(kind="k", key="x")])
        assert await store.queue.pending() == 0

    async def test_fenced_claim_takes_nothing_with_a_stale_token(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x")])
        old = await self._taken_over_lease(store)
        assert await self._claim(store, fence=old) == []
        current = await store.leases.get("job")
        assert current is not None
        assert _keys(await self._claim(store, fence=current)) == ["x"]

    # The same holder taking its own lapsed lease again: between the two, another holder may have held it and
    # written, so the old token must be as dead as if someone else had taken the lease.

    async def test_holder_reacquiring_after_expiry_gets_a_new_token(self, store: Store) -> None:
        old, new = await self._reacquired_by_the_same_holder(store)
        assert new.token > old.token
        assert await store.leases.renew(old, LONG) is None
        assert await store.leases.release(old) is False
        assert await store.leases.get("job") == new

    async def test_fenced_transaction_refuses_the_same_holders_lapsed_token(self, store: Store) -> None:
        old, new = await self._reacquired_by_the_same_holder(store)
        with pytest.raises(FailedPreconditionError):
            async with store.transaction(fence=old) as tx:
                await tx.enqueue([WorkItem(kind="k", key="x")])
        assert await store.queue.pending() == 0
        async with store.transaction(fence=new) as tx:
            await tx.enqueue([WorkItem(kind="k", key="x")])
        assert await store.queue.pending() == 1

    async def test_fenced_claim_and_complete_refuse_the_same_holders_lapsed_token(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x"), WorkItem(kind="k", key="y")])
        old = await store.leases.acquire("job", "a", SHORT)
        assert old is not None
        [claimed] = await self._claim(store, fence=old, limit=1)
        await anyio.sleep(PAST_SHORT)
        new = await store.leases.acquire("job", "a", LONG)
        assert new is not None
        assert await self._claim(store, fence=old) == []
        assert await store.queue.complete(claimed, fence=old) is False
        assert await store.queue.retry(claimed, delay=LONG, error="stale", fence=old) is False
        assert await store.queue.pending() == 2
        assert await store.queue.complete(claimed, fence=new) is True
        assert await store.queue.pending() == 1

    async def _reacquired_by_the_same_holder(self, store: Store) -> tuple[Lease, Lease]:
        old = await store.leases.acquire("job", "a", SHORT)
        assert old is not None
        await anyio.sleep(PAST_SHORT)
        new = await store.leases.acquire("job", "a", LONG)
        assert new is not None
        return old, new

    async def _taken_over_lease(self, store: Store) -> Lease:
        old = await store.leases.acquire("job", "a", SHORT)
        assert old is not None
        await anyio.sleep(PAST_SHORT)
        assert await store.leases.acquire("job", "b", LONG) is not None
        return old

    # --- work queue -------------------------------------------------------------------------------------------

    async def test_claim_hands_out_work_with_its_payload(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x", shard=7, payload={"n": 1, "tags": ["a"]})])
        [claim] = await self._claim(store)
        assert (claim.kind, claim.key, claim.shard, claim.attempts) == ("k", "x", 7, 1)
        assert claim.payload == {"n": 1, "tags": ["a"]}
        assert claim.last_error is None
        assert claim.claimed_until > await store.now()
        assert await self._claim(store) == []

    async def test_enqueue_dedupes_a_waiting_key_keeping_the_earlier_run_at(self, store: Store) -> None:
        now = await store.now()
        later = now + dt.timedelta(hours=1)
        await store.queue.enqueue([WorkItem(kind="k", key="soon-first")])
        await store.queue.enqueue([WorkItem(kind="k", key="soon-first", run_at=later)])
        await store.queue.enqueue([WorkItem(kind="k", key="late-first", run_at=later)])
        await store.queue.enqueue([WorkItem(kind="k", key="late-first")])
        # Duplicates inside one batch merge too.
        await store.queue.enqueue([WorkItem(kind="k", key="batch", run_at=later), WorkItem(kind="k", key="batch")])
        assert await store.queue.pending() == 3
        assert sorted(_keys(await self._claim(store))) == ["batch", "late-first", "soon-first"]

    async def test_same_key_of_another_kind_is_another_item(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x"), WorkItem(kind="other", key="x")])
        assert await store.queue.pending() == 2
        assert await store.queue.pending(["other"]) == 1

    async def test_future_work_is_not_due(self, store: Store) -> None:
        later = await store.now() + dt.timedelta(hours=1)
        await store.queue.enqueue([WorkItem(kind="k", key="x", run_at=later)])
        assert await self._claim(store) == []
        assert await store.queue.pending() == 1

    async def test_depth_counts_due_items_not_running_per_kind(self, store: Store) -> None:
        now = await store.now()
        later = now + dt.timedelta(hours=1)
        await store.queue.enqueue(
            [
                WorkItem(kind="k", key="due-1"),
                WorkItem(kind="k", key="due-2"),
                WorkItem(kind="k", key="later", run_at=later),
                WorkItem(kind="other", key="due"),
                WorkItem(kind="unasked", key="due"),
            ]
        )
        assert await store.queue.depth(["k", "other"]) == {"k": 2, "other": 1}
        assert await store.queue.depth([]) == {}
        # A running item is not waiting; one whose claim ran out is due again.
        [running] = await self._claim(store, limit=1)
        [lapsed] = await self._claim(store, kinds=["other"], claim_for=SHORT)
        assert (await store.queue.depth(["k", "other"])).get("other", 0) == 0
        assert (await store.queue.depth(["k"]))["k"] == 1
        await anyio.sleep(PAST_SHORT)
        assert await store.queue.depth(["k", "other"]) == {"k": 1, "other": 1}
        assert running.key.startswith("due-") and lapsed.key == "due"

    async def test_a_claim_says_when_its_item_became_due(self, store: Store) -> None:
        now = await store.now()
        earlier = now - dt.timedelta(minutes=3)
        await store.queue.enqueue([WorkItem(kind="k", key="x", run_at=earlier)])
        [claim] = await self._claim(store, claim_for=SHORT)
        assert claim.due_at == earlier
        # Taken over after its claim ran out: due since that claim's end.
        await anyio.sleep(PAST_SHORT)
        [again] = await self._claim(store, holder="worker-b")
        assert again.due_at == claim.claimed_until

    async def test_claim_takes_the_oldest_first_up_to_the_limit(self, store: Store) -> None:
        now = await store.now()
        await store.queue.enqueue(
            [WorkItem(kind="k", key=str(n), run_at=now - dt.timedelta(seconds=n)) for n in (1, 3, 2)]
        )
        assert _keys(await self._claim(store, limit=2)) == ["3", "2"]
        assert _keys(await self._claim(store, limit=2)) == ["1"]

    async def test_claim_filters_by_kind_and_shard(self, store: Store) -> None:
        await store.queue.enqueue(
            [
                WorkItem(kind="k", key="s0", shard=0),
                WorkItem(kind="k", key="s1", shard=1),
                WorkItem(kind="k", key="s2", shard=2),
                WorkItem(kind="other", key="o", shard=1),
            ]
        )
        assert sorted(_keys(await self._claim(store, shards=[1, 2]))) == ["s1", "s2"]
        assert _keys(await self._claim(store, kinds=["other"])) == ["o"]
        assert _keys(await self._claim(store)) == ["s0"]

    async def test_complete_removes_the_work(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x")])
        [claim] = await self._claim(store)
        assert await store.queue.pending() == 1
        assert await store.queue.complete(claim) is True
        assert await store.queue.pending() == 0
        assert await store.queue.complete(claim) is False

    async def test_a_claimed_key_is_not_handed_out_twice(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x", payload={"v": 1})])
        [claim] = await self._claim(store)
        await store.queue.enqueue([WorkItem(kind="k", key="x", payload={"v": 2})])
        assert await self._claim(store, holder="worker-b") == []
        # Finishing the first pass makes the request that came in meanwhile due, with its payload.
        assert await store.queue.complete(claim) is True
        [again] = await self._claim(store, holder="worker-b")
        assert (again.key, again.payload, again.attempts) == ("x", {"v": 2}, 1)

    async def test_expired_claims_are_claimed_again_and_the_old_claim_is_lost(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x")])
        [old] = await self._claim(store, claim_for=SHORT)
        await anyio.sleep(PAST_SHORT)
        [new] = await self._claim(store, holder="worker-b")
        assert new.key == "x"
        assert new.attempts == 2
        assert new.token != old.token
        assert await store.queue.complete(old) is False
        assert await store.queue.retry(old, delay=NO_DELAY, error="late") is False
        assert await store.queue.extend(old, LONG) is None
        assert await store.queue.pending() == 1
        assert await store.queue.complete(new) is True
        assert await store.queue.pending() == 0

    async def test_retry_hands_the_work_back_with_the_error(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x")])
        [claim] = await self._claim(store)
        assert await store.queue.retry(claim, delay=NO_DELAY, error="boom") is True
        [again] = await self._claim(store)
        assert (again.attempts, again.last_error) == (2, "boom")
        assert await store.queue.complete(claim) is False

    async def test_retry_delay_postpones_the_work(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x")])
        [claim] = await self._claim(store)
        assert await store.queue.retry(claim, delay=dt.timedelta(hours=1), error="boom") is True
        assert await self._claim(store) == []
        assert await store.queue.pending() == 1

    async def test_retry_merges_with_work_enqueued_meanwhile(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x")])
        [claim] = await self._claim(store)
        await store.queue.enqueue([WorkItem(kind="k", key="x", payload={"v": 2})])
        assert await store.queue.retry(claim, delay=dt.timedelta(hours=1), error="boom") is True
        assert await store.queue.pending() == 1
        # The new request was due now, earlier than the retry: one item, due now.
        [again] = await self._claim(store)
        assert again.key == "x"
        assert again.payload == {"v": 2}

    async def test_extend_keeps_a_claim_alive(self, store: Store) -> None:
        await store.queue.enqueue([WorkItem(kind="k", key="x")])
        [claim] = await self._claim(store, claim_for=SHORT)
        extended = await store.queue.extend(claim, LONG)
        assert extended is not None
        assert extended.token == claim.token
        assert extended.claimed_until > claim.claimed_until
        await anyio.sleep(PAST_SHORT)
        assert await self._claim(store, holder="worker-b") == []
        assert await store.queue.complete(extended) is True

    async def test_transaction_enqueue_commits_and_rolls_back(self, store: Store) -> None:
        async with store.transaction() as tx:
            await tx.enqueue([WorkItem(kind="k", key="kept")])
        with pytest.raises(RuntimeError):
            async with store.transaction() as tx:
                await tx.enqueue([WorkItem(kind="k", key="dropped")])
                raise RuntimeError("the caller failed")
        assert _keys(await self._claim(store)) == ["kept"]

    # --- outbox -----------------------------------------------------------------------------------------------

    async def _publish(self, store: Store, *events: tuple[str, str]) -> None:
        async with store.transaction() as tx:
            await tx.publish([OutboxEvent(type="t", key=key, payload={"name": name}) for key, name in events])

    async def _outbox_claim(self, store: Store, **kwargs: object) -> list[StoredEvent]:
        options: dict[str, object] = {"holder": "sink-a", "limit": 10, "claim_for": LONG}
        options.update(kwargs)
        return await store.outbox.claim(**options)  # type: ignore[arg-type]

    async def test_outbox_hands_out_one_event_per_key_in_order(self, store: Store) -> None:
        await self._publish(store, ("a", "a1"), ("a", "a2"), ("b", "b1"))
        await self._publish(store, ("a", "a3"))
        first = await self._outbox_claim(store)
        assert [(e.key, e.seq, e.payload["name"]) for e in first] == [("a", 1, "a1"), ("b", 1, "b1")]
        assert all(e.type == "t" for e in first)
        assert await self._outbox_claim(store) == []
        assert await store.outbox.ack([first[0]]) == 1
        [second] = await self._outbox_claim(store)
        assert (second.key, second.seq, second.payload["name"]) == ("a", 2, "a2")
        assert await store.outbox.ack([second, first[1]]) == 2
        [third] = await self._outbox_claim(store)
        assert (third.key, third.seq, third.payload["name"]) == ("a", 3, "a3")
        assert await store.outbox.ack([third]) == 1
        assert await self._outbox_claim(store) == []

    async def test_outbox_events_are_visible_only_after_commit(self, store: Store) -> None:
        async with store.transaction() as tx:
            await tx.publish([OutboxEvent(type="t", key="a")])
            assert await self._outbox_claim(store) == []
        assert _keys(await self._outbox_claim(store)) == ["a"]

    async def test_rolled_back_transaction_publishes_nothing(self, store: Store) -> None:
        with pytest.raises(RuntimeError):
            async with store.transaction() as tx:
                await tx.publish([OutboxEvent(type="t", key="a")])
                raise RuntimeError("the caller failed")
        assert await self._outbox_claim(store) == []
        # The rolled-back event took no number: the next one is still 1.
        await self._publish(store, ("a", "a1"))
        [event] = await self._outbox_claim(store)
        assert event.seq == 1

    async def test_outbox_release_hands_an_event_back(self, store: Store) -> None:
        await self._publish(store, ("a", "a1"), ("a", "a2"))
        [event] = await self._outbox_claim(store)
        assert await store.outbox.release([event], delay=NO_DELAY) == 1
        [again] = await self._outbox_claim(store, holder="sink-b")
        assert (again.id, again.seq) == (event.id, 1)
        assert again.token != event.token
        assert await store.outbox.ack([event]) == 0
        assert await store.outbox.release([event], delay=NO_DELAY) == 0
        assert await store.outbox.ack([again]) == 1

    async def test_outbox_release_delay_holds_back_the_key(self, store: Store) -> None:
        await self._publish(store, ("a", "a1"), ("a", "a2"))
        [event] = await self._outbox_claim(store)
        assert await store.outbox.release([event], delay=dt.timedelta(hours=1)) == 1
        # Neither the released event nor the one after it in the same key may go out.
        assert await self._outbox_claim(store) == []

    async def test_expired_outbox_claims_are_claimed_again(self, store: Store) -> None:
        await self._publish(store, ("a", "a1"))
        [event] = await self._outbox_claim(store, claim_for=SHORT)
        await anyio.sleep(PAST_SHORT)
        [again] = await self._outbox_claim(store, holder="sink-b")
        assert again.id == event.id
        assert await store.outbox.ack([event]) == 0
        assert await store.outbox.ack([again]) == 1

    async def test_outbox_claim_respects_the_limit(self, store: Store) -> None:
        await self._publish(store, *[(f"k{n}", "e") for n in range(5)])
        assert len(await self._outbox_claim(store, limit=3)) == 3
        assert len(await self._outbox_claim(store, limit=3)) == 2

    # --- idempotency keys -------------------------------------------------------------------------------------

    async def test_idempotency_new_in_progress_replay_conflict(self, store: Store) -> None:
        keys = store.idempotency
        begin = {"identity": "alice", "key": "k1", "ttl": LONG}
        assert (await keys.begin(request_hash="h1", **begin)).state == "new"  # type: ignore[arg-type]
        assert (await keys.begin(request_hash="h1", **begin)).state == "in_progress"  # type: ignore[arg-type]
        assert (await keys.begin(request_hash="h2", **begin)).state == "conflict"  # type: ignore[arg-type]
        await keys.finish(identity="alice", key="k1", result={"id": "r-1"})
        replay = await keys.begin(request_hash="h1", **begin)  # type: ignore[arg-type]
        assert (replay.state, replay.result) == ("replay", {"id": "r-1"})
        assert (await keys.begin(request_hash="h2", **begin)).state == "conflict"  # type: ignore[arg-type]

    async def test_idempotency_keys_are_per_identity(self, store: Store) -> None:
        keys = store.idempotency
        assert (await keys.begin(identity="alice", key="k", request_hash="h", ttl=LONG)).state == "new"
        assert (await keys.begin(identity="bob", key="k", request_hash="other", ttl=LONG)).state == "new"

    async def test_abandoned_key_can_be_used_again(self, store: Store) -> None:
        keys = store.idempotency
        assert (await keys.begin(identity="alice", key="k", request_hash="h1", ttl=LONG)).state == "new"
        await keys.abandon(identity="alice", key="k")
        assert (await keys.begin(identity="alice", key="k", request_hash="h2", ttl=LONG)).state == "new"

    async def test_expired_key_can_be_used_again(self, store: Store) -> None:
        keys = store.idempotency
        assert (await keys.begin(identity="alice", key="k", request_hash="h1", ttl=SHORT)).state == "new"
        await anyio.sleep(PAST_SHORT)
        assert (await keys.begin(identity="alice", key="k", request_hash="h2", ttl=LONG)).state == "new"

    async def test_concurrent_begins_with_one_key_make_one_new(self, store: Store) -> None:
        states: list[str] = []

        async def begin() -> None:
            outcome = await store.idempotency.begin(identity="alice", key="k", request_hash="h", ttl=LONG)
            states.append(outcome.state)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(begin)
        assert sorted(states) == ["in_progress"] * 7 + ["new"]
