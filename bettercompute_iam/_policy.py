"""The authorization policy, as pure functions: action patterns, built-in roles, and scope matching.

A role is a set of action patterns. A pattern has the three segments of an action (``compute:reservations:create``)
and any segment may be ``*``. A binding gives a role to a principal on a scope: the root scope (everything), a
tenant, or a pool. A principal may do an action on a resource when one of its bindings has a matching pattern and a
scope that contains the resource.

Containment is one rule (``contains``): the root scope contains every scope, a tenant contains itself and its own
pools, a pool contains itself. The same rule decides requests (``allows``), what a binding may hand out
(``uncovered``) and whom a principal may act on (``not_held``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from typing import Protocol

import attrs

__all__ = [
    "BUILTIN_ROLE_NAMES",
    "Grant",
    "allows",
    "builtin_roles",
    "contains",
    "covered",
    "matches",
    "not_held",
    "pattern_problem",
    "uncovered",
]

_SEGMENT = re.compile(r"^(\*|[a-z][a-z0-9-]*)$")

# Built-in roles. The admin of a scope also manages IAM inside it; an operator runs the fleet; a member uses
# capacity; a viewer reads; an authz client asks for decisions on behalf of another process. The viewer's and the
# member's actions come from the methods' declarations (their ``access``), so a new read-only method is in the
# viewer role without anyone listing it here.
BUILTIN_ROLE_NAMES = ("compute.admin", "compute.operator", "compute.member", "compute.viewer", "compute.authz-client")


class _Declared(Protocol):
    def actions(self, *, access: Collection[str] | None = None) -> set[str]: ...


def builtin_roles(registry: _Declared) -> dict[str, tuple[str, ...]]:
    """The built-in roles' actions for the methods ``registry`` holds (``compute.registry``)."""
    read = registry.actions(access=("open", "read"))
    use = registry.actions(access=("use",))
    iam_read = sorted(a for a in read if a.startswith("iam:"))
    return {
        "compute.admin": ("compute:*:*", "iam:*:*"),
        "compute.operator": ("compute:*:*", *iam_read),
        "compute.member": tuple(sorted(read | use)),
        "compute.viewer": tuple(sorted(read)),
        # For the service account of an api process whose RemoteIam asks a central IAM (bind it on the root scope).
        "compute.authz-client": ("iam:authz:*",),
    }


def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is not a valid action pattern, or ``None``."""
    parts = pattern.split(":")
    if len(parts) != 3 or not all(_SEGMENT.match(p) for p in parts):
        return f"{pattern!r} is not an action pattern like 'compute:reservations:*'"
    return None


def matches(pattern: str, action: str) -> bool:
    """Whether ``action`` falls under ``pattern``."""
    wanted = pattern.split(":")
    have = action.split(":")
    return len(wanted) == len(have) and all(w in ("*", h) for w, h in zip(wanted, have, strict=True))


@attrs.frozen(kw_only=True)
class Grant:
    """What one binding gives: the role's patterns, on a scope (``root``, or ``tenant``/``pool`` with an id).

    ``scope_tenant`` is the tenant the scope lies in: the tenant itself for a tenant scope, the pool's tenant (from
    the authorization projection) for a pool scope, ``None`` for the root scope or a pool nobody knows.
    """

    patterns: tuple[str, ...]
    scope_type: str
    scope_id: str | None
    scope_tenant: str | None = None


def contains(grant: Grant, *, scope_type: str, scope_id: str | None, scope_tenant: str | None) -> bool:
    """Whether ``grant``'s scope contains the scope ``(scope_type, scope_id)``, which lies in ``scope_tenant``.

    The root contains everything; a tenant contains itself and the pools that lie in it (a pool whose tenant is
    unknown lies in none); a pool contains only itself.
    """
    if grant.scope_type == "root":
        return True
    if grant.scope_type == "tenant" and scope_type == "pool":
        return scope_tenant is not None and grant.scope_id == scope_tenant
    return scope_id is not None and (grant.scope_type, grant.scope_id) == (scope_type, scope_id)


def allows(grants: Iterable[Grant], action: str, *, tenant: str | None, pool: str | None) -> bool:
    """Whether any grant allows ``action`` on a resource of ``tenant`` and ``pool`` (either may be unknown)."""
    scope_type, scope_id = ("pool", pool) if pool is not None else ("tenant", tenant)
    for grant in grants:
        in_scope = contains(grant, scope_type=scope_type, scope_id=scope_id, scope_tenant=tenant)
        if in_scope and any(matches(p, action) for p in grant.patterns):
            return True
    return False


def uncovered(
    grants: Iterable[Grant],
    patterns: Iterable[str],
    *,
    scope_type: str,
    scope_id: str | None,
    scope_tenant: str | None = None,
) -> list[str]:
    """The patterns that ``grants`` do not hold on the scope ``(scope_type, scope_id)`` lying in ``scope_tenant``.

    A grant holds a pattern there when its scope contains that scope (``contains``) and each segment of its own
    pattern is ``*`` or equal to the pattern's.
    """
    grants = list(grants)
    missing = []
    for pattern in patterns:
        wanted = pattern.split(":")
        held = False
        for grant in grants:
            if not contains(grant, scope_type=scope_type, scope_id=scope_id, scope_tenant=scope_tenant):
                continue
            for have in grant.patterns:
                parts = have.split(":")
                if len(parts) == len(wanted) and all(h in ("*", w) for h, w in zip(parts, wanted, strict=True)):
                    held = True
                    break
            if held:
                break
        if not held:
            missing.append(pattern)
    return missing


def not_held(mine: Iterable[Grant], theirs: Iterable[Grant]) -> list[str]:
    """What another principal holds that ``mine`` do not, each pattern once, sorted (empty: I hold all of it).

    Someone who acts on a principal (mints or revokes its credential, disables it, changes its bindings) must hold
    everything that principal holds, scope by scope: otherwise minting its credential, say, would hand its powers
    to the one who minted it.
    """
    mine = list(mine)
    missing: set[str] = set()
    for grant in theirs:
        missing.update(
            uncovered(
                mine,
                grant.patterns,
                scope_type=grant.scope_type,
                scope_id=grant.scope_id,
                scope_tenant=grant.scope_tenant,
            )
        )
    return sorted(missing)


def covered(patterns: Sequence[str], catalog: Iterable[str]) -> list[str]:
    """The patterns that match no action of the catalog (most likely typos)."""
    actions = list(catalog)
    return [p for p in patterns if not any(matches(p, a) for a in actions)]
