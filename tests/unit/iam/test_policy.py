"""The scope rule of the embedded IAM's policy, without a database."""

from __future__ import annotations

from hypothesis import given

from bettercompute_iam._policy import Grant, allows, contains, not_held
from tests.strategies import grants

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


@given(grants())
def test_anyone_may_act_on_herself(mine: list[Grant]) -> None:
    assert not_held(mine, mine) == []


@given(grants(), grants())
def test_a_root_admin_holds_everything_anyone_holds(mine: list[Grant], theirs: list[Grant]) -> None:
    assert not_held([grant("root", None, None, "*:*:*"), *mine], theirs) == []
