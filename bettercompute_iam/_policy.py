"""The authorization policy, as pure functions: action patterns, built-in roles, and scope matching.

A role is a set of action patterns. A pattern has the three segments of an action (``compute:reservations:create``)
and any segment may be ``*``. A binding gives a role to a principal on a scope: the root scope (everything), a
tenant, or a pool. A principal may do an action on a resource when one of its bindings has a matching pattern and a
scope that contains the resource.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import attrs

__all__ = ["BUILTIN_ROLES", "Grant", "allows", "covered", "matches", "pattern_problem", "uncovered"]

_SEGMENT = re.compile(r"^(\*|[a-z][a-z0-9-]*)$")

# Built-in roles. The admin of a scope also manages IAM inside it; an operator runs the fleet; a member uses
# capacity; a viewer reads; an authz client asks for decisions on behalf of another process.
BUILTIN_ROLES: dict[str, tuple[str, ...]] = {
    "compute.admin": ("compute:*:*", "iam:*:*"),
    "compute.operator": ("compute:*:*", "iam:*:list"),
    "compute.member": (
        "compute:system:*",
        "compute:*:list",
        "compute:*:get",
        "compute:reservations:*",
        "compute:instances:*",
        "iam:*:list",
    ),
    "compute.viewer": ("compute:system:*", "compute:*:list", "compute:*:get", "iam:*:list"),
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
    """What one binding gives: the role's patterns, on a scope (``root``, or ``tenant``/``pool`` with an id)."""

    patterns: tuple[str, ...]
    scope_type: str
    scope_id: str | None


def allows(grants: Iterable[Grant], action: str, *, tenant: str | None, pool: str | None) -> bool:
    """Whether any grant allows ``action`` on a resource of ``tenant`` and ``pool`` (either may be unknown)."""
    for grant in grants:
        if grant.scope_type == "root":
            in_scope = True
        elif grant.scope_type == "tenant":
            in_scope = tenant is not None and grant.scope_id == tenant
        else:
            in_scope = pool is not None and grant.scope_id == pool
        if in_scope and any(matches(p, action) for p in grant.patterns):
            return True
    return False


def uncovered(grants: Iterable[Grant], patterns: Iterable[str], *, scope_type: str, scope_id: str | None) -> list[str]:
    """The patterns that ``grants`` do not hold on the scope ``(scope_type, scope_id)``.

    A grant holds a pattern there when its scope contains that scope (the root contains every scope; a tenant or a
    pool contains only itself) and each segment of its own pattern is ``*`` or equal to the pattern's.
    """
    missing = []
    for pattern in patterns:
        wanted = pattern.split(":")
        held = False
        for grant in grants:
            if grant.scope_type != "root" and (grant.scope_type, grant.scope_id) != (scope_type, scope_id):
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


def covered(patterns: Sequence[str], catalog: Iterable[str]) -> list[str]:
    """The patterns that match no action of the catalog (most likely typos)."""
    actions = list(catalog)
    return [p for p in patterns if not any(matches(p, a) for a in actions)]
