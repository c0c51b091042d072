"""The ``nodes`` module's repositories: nodes and their conditions, join tokens, JoinService's keys, the node CA's
keys and certificates, and tunnels."""

from __future__ import annotations

from collections.abc import Callable

from bettercompute_store_pg._db import Database
from bettercompute_store_pg._repository import PgRepository
from bettercompute_store_pg.modules.nodes._certificates import PgCertificates
from bettercompute_store_pg.modules.nodes._join_tokens import PgJoinTokens
from bettercompute_store_pg.modules.nodes._nodes import PgJoinKeys, PgNodes
from bettercompute_store_pg.modules.nodes._tunnels import PgTunnels

__all__ = ["REPOSITORIES"]

REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {
    "certificates": PgCertificates,
    "nodes": PgNodes,
    "join_keys": PgJoinKeys,
    "join_tokens": PgJoinTokens,
    "tunnels": PgTunnels,
}
"""The adapters of this module's repositories, by ``Repository.name``."""
