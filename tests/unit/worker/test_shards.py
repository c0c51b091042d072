"""Rendezvous hashing of shards, the default shard of a key, and the retry backoff."""

from __future__ import annotations

import datetime as dt

import pytest

from bettercompute import Outcome, Reconciler, RetryPolicy, shard_of
from bettercompute._runtime.shards import SHARDS, assign, owned_by, owner


async def _noop(ctx: object, key: str) -> Outcome:
    return Outcome.done()


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_shards_spread_evenly_ish(n: int) -> None:
    members = [f"host-{i}:{1000 + i}/abcd{i:04x}" for i in range(n)]
    owned = assign(members)
    assert sorted(s for shards in owned.values() for s in shards) == list(range(SHARDS))
    fair = SHARDS / n
    for shards in owned.values():
        assert 0.5 * fair <= len(shards) <= 1.6 * fair, {m: len(s) for m, s in owned.items()}


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_adding_a_member_moves_only_its_share(n: int) -> None:
    members = [f"worker-{i}" for i in range(n)]
    before = {s: owner(s, members) for s in range(SHARDS)}
    after = {s: owner(s, [*members, "newcomer"]) for s in range(SHARDS)}
    moved = [s for s in range(SHARDS) if before[s] != after[s]]
    # Every moved shard went to the newcomer (nobody else's shards were reshuffled), about 1/(n+1) of them.
    assert all(after[s] == "newcomer" for s in moved)
    assert len(moved) <= 1.6 * SHARDS / (n + 1)
    assert len(moved) >= 0.5 * SHARDS / (n + 1)


def test_removing_a_member_moves_only_its_shards() -> None:
    members = [f"worker-{i}" for i in range(4)]
    before = {s: owner(s, members) for s in range(SHARDS)}
    after = {s: owner(s, members[1:]) for s in range(SHARDS)}
    assert {s for s in range(SHARDS) if before[s] != after[s]} == {s for s in range(SHARDS) if before[s] == "worker-0"}


def test_every_member_computes_the_same_assignment() -> None:
    members = ["c", "a", "b"]
    owned = {m: owned_by(m, members) for m in members}
    assert owned == assign(list(reversed(members)))
    assert owner(3, []) is None


def test_shard_of_is_stable_and_in_range() -> None:
    # A fixed value: the hash must not change between processes or releases (PYTHONHASHSEED plays no part).
    assert shard_of("node/n-1") == shard_of("node/n-1")
    values = {shard_of(f"key-{i}") for i in range(5000)}
    assert values == set(range(SHARDS))
    reconciler = Reconciler(kind="probe", reconcile=_noop)
    assert reconciler.item("node/n-1").shard == shard_of("node/n-1")
    custom = Reconciler(kind="pool", reconcile=_noop, shard_of=lambda key: 300)
    assert custom.item("p").shard == 300 % SHARDS


def test_backoff_grows_is_capped_and_repeats_for_the_same_attempt() -> None:
    policy = RetryPolicy(base=dt.timedelta(seconds=1), max_delay=dt.timedelta(seconds=30), jitter=0.2)
    delays = [policy.delay("k", "key", attempt).total_seconds() for attempt in range(1, 10)]
    assert 0.8 <= delays[0] <= 1.2 and 1.6 <= delays[1] <= 2.4 and 3.2 <= delays[2] <= 4.8
    assert max(delays) <= 36
    assert [policy.delay("k", "key", a) for a in range(1, 10)] == [policy.delay("k", "key", a) for a in range(1, 10)]
    # Different keys spread out instead of retrying in lockstep.
    assert len({policy.delay("k", f"key-{i}", 3) for i in range(20)}) > 10


def test_a_reconciler_needs_a_known_role_and_a_positive_deadline() -> None:
    with pytest.raises(ValueError, match="role"):
        Reconciler(kind="x", reconcile=_noop, role="sinks")
    with pytest.raises(ValueError, match="deadline"):
        Reconciler(kind="x", reconcile=_noop, deadline=dt.timedelta(0))
