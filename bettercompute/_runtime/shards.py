"""Shards: 256 per role, spread over the live workers of the role by rendezvous (highest-random-weight) hashing.

Every worker computes the same owner for a shard from the same member list, with no coordination; a member joining
or leaving moves only the shards it wins or held (about 1/N of them).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable

__all__ = ["SHARDS", "assign", "owned_by", "owner", "shard_of"]

SHARDS = 256
"""Shards per role: work item keys hash onto them, and each is held under a lease ``<role>/shard:<n>``."""


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def shard_of(key: str) -> int:
    """The default shard of a work item's key: a stable hash (the same in every process and release), mod 256."""
    return _digest(key) % SHARDS


def owner(shard: int, members: Iterable[str]) -> str | None:
    """The member with the highest weight for ``shard`` (``None`` without members); ties go to the lower id."""
    best: tuple[int, str] | None = None
    for member in members:
        weight = _digest(f"{member}\x00{shard}")
        if best is None or weight > best[0] or (weight == best[0] and member < best[1]):
            best = (weight, member)
    return None if best is None else best[1]


def assign(members: Collection[str], shards: int = SHARDS) -> dict[str, set[int]]:
    """Every member's shards (members without any map to an empty set)."""
    owned: dict[str, set[int]] = {member: set() for member in members}
    for shard in range(shards):
        winner = owner(shard, members)
        if winner is not None:
            owned[winner].add(shard)
    return owned


def owned_by(member: str, members: Collection[str], shards: int = SHARDS) -> set[int]:
    """The shards ``member`` should hold among ``members`` (itself included or not)."""
    everyone = set(members) | {member}
    return {shard for shard in range(shards) if owner(shard, everyone) == member}
