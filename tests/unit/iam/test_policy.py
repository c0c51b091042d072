"""The scope rule of the embedded IAM's policy, without a database."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bettercompute_iam._policy import Grant, allows, contains, not_held

ADMIN = ("compute:*:*", "iam:*:*")


def grant(scope_type: str, scope_id: str | None = None, scope_tenant: str | None = None, *patterns: str) -> Grant:
    return Grant(patterns=patterns or ADMIN, scope_type=scope_type, scope_id=scope_id, scope_tenant=scope_tenant)


def test_a_tenant_contains_its_own_pools_only() -> None:
    acme = grant("tenant", "acme", "acme")
    assert contains(acme, scope_type="pool", scope_id="pl_a", scope_tenant="acme")
    assert not contains(acme, scope_type="pool", scope_id="pl_g", scope_tenant="globex")
    assert not contains(acme, scope_type="pool", scope_id="pl_unknown", scope_tenant=None)
    assert contains(acme, scope_type="tenant", scope_id="acme", scope_tenant="acme")
    assert not contains(acme, scope_type="root", scope_id=None, scope_tenant=None)


def test_a_pool_contains_itself_and_no_tenant() -> None:
    pool = grant("pool", "pl_a", "acme")
    assert contains(pool, scope_type="pool", scope_id="pl_a", scope_tenant="acme")
    assert not contains(pool, scope_type="tenant", scope_id="acme", scope_tenant="acme")
    assert not allows([pool], "compute:pools:list", tenant="acme", pool=None)
    assert allows([pool], "compute:pools:get", tenant="acme", pool="pl_a")


def test_what_a_tenant_admin_may_act_on() -> None:
    alice = [grant("tenant", "acme", "acme")]
    assert not_held(alice, [grant("pool", "pl_a", "acme", "compute:reservations:*")]) == []
    assert not_held(alice, [grant("pool", "pl_g", "globex", "compute:reservations:*")]) == ["compute:reservations:*"]
    assert not_held(alice, [grant("root", None, None, "compute:*:list")]) == ["compute:*:list"]
    assert not_held([grant("root")], [grant("pool", "pl_g", None, "iam:*:*")]) == []


scopes = st.one_of(
    st.builds(lambda: ("root", None, None)),
    st.tuples(st.just("tenant"), st.sampled_from(["acme", "globex"])).map(lambda t: (t[0], t[1], t[1])),
    st.tuples(st.just("pool"), st.sampled_from(["pl_a", "pl_b"]), st.sampled_from(["acme", "globex", None])),
)
patterns = st.tuples(
    st.sampled_from(["compute", "iam", "*"]),
    st.sampled_from(["pools", "credentials", "*"]),
    st.sampled_from(["*", "list"]),
).map(":".join)
grants = st.lists(
    st.builds(
        lambda scope, p: Grant(patterns=tuple(p), scope_type=scope[0], scope_id=scope[1], scope_tenant=scope[2]),
        scopes,
        st.lists(patterns, min_size=1, max_size=3),
    ),
    max_size=4,
)


@given(grants)
def test_anyone_may_act_on_herself(mine: list[Grant]) -> None:
    assert not_held(mine, mine) == []


@given(grants, grants)
def test_a_root_admin_holds_everything_anyone_holds(mine: list[Grant], theirs: list[Grant]) -> None:
    assert not_held([grant("root", None, None, "*:*:*"), *mine], theirs) == []
