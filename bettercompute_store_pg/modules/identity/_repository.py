"""The node identity module's repositories: the node CA's keys and certificates, nodes and JoinService's keys."""

from __future__ import annotations

from collections.abc import Callable

from bettercompute_store_pg._db import Database
from bettercompute_store_pg._repository import PgRepository
from bettercompute_store_pg.modules.identity._certificates import PgCertificates
from bettercompute_store_pg.modules.identity._inventory import PgInventory
from bettercompute_store_pg.modules.identity._nodes import PgJoinKeys, PgNodes
from bettercompute_store_pg.modules.identity._tunnels import PgTunnels

__all__ = ["REPOSITORIES"]

REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {
    "certificates": PgCertificates,
    "nodes": PgNodes,
    "join_keys": PgJoinKeys,
    "inventory": PgInventory,
    "tunnels": PgTunnels,
}
"""The adapters of this module's repositories, by ``Repository.name``."""
