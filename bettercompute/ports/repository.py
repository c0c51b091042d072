"""The typed key of a repository: how a module names the store's adapter of its repository protocol."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, TypeVar

import attrs

__all__ = ["Repository"]

R = TypeVar("R")


@attrs.frozen
class Repository(Generic[R]):
    """The typed key of a module's repository: a module declares ``POOLS: Repository[Pools] = Repository(
    module="pools", name="pools")`` beside its ``Pools`` protocol.

    There is one way to reach a repository: ``tx.repository(POOLS)`` inside ``async with call.transaction() as tx:``
    (its reads see the transaction's own writes, its writes commit or roll back with it) and
    ``store.repository(POOLS)`` outside any transaction (each call a statement on its own, in autocommit). No
    repository method takes a transaction as a parameter; a method that only makes sense inside one (a lock, a
    ``FOR UPDATE``, a write that must roll back with the others) refuses a call on ``store.repository(...)`` with
    ``InternalError``.

    The store finds the adapter by ``module`` and ``name``: the PostgreSQL store in
    ``bettercompute_store_pg.modules.<module>``, so a module adds its repositories without a line in any protocol.
    A module shipped in a package of its own names, per store dialect, the Python module holding its adapters in
    ``adapters`` (``{"postgresql": "my_package._pg"}``); it takes no part in the key's equality.
    """

    module: str
    name: str
    adapters: Mapping[str, str] = attrs.field(factory=dict, eq=False, repr=False)
