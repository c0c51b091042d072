"""The ``nodes`` module's repositories: nodes and their conditions, join tokens, JoinService's keys, the node CA's
keys and certificates, tunnels, and the KMS blobs a re-wrap walks."""

from __future__ import annotations

from collections.abc import Callable

from bettercompute.modules.nodes import ca_key_context, join_key_context, signing_key_context
from bettercompute_store_pg._db import Database
from bettercompute_store_pg._repository import PgRepository
from bettercompute_store_pg._sealed import sealed_column
from bettercompute_store_pg.modules.nodes._certificates import PgCertificates
from bettercompute_store_pg.modules.nodes._join_tokens import PgJoinTokens
from bettercompute_store_pg.modules.nodes._nodes import PgJoinKeys, PgNodes
from bettercompute_store_pg.modules.nodes._rewraps import PgRewraps
from bettercompute_store_pg.modules.nodes._tunnels import PgTunnels

__all__ = ["REPOSITORIES"]

REPOSITORIES: dict[str, Callable[[Database], PgRepository]] = {
    "certificates": PgCertificates,
    "nodes": PgNodes,
    "join_keys": PgJoinKeys,
    "join_tokens": PgJoinTokens,
    "tunnels": PgTunnels,
    "rewraps": PgRewraps,
    "sealed_ca_keys": sealed_column(
        "ca_keys", "sealed_key", lambda r: ca_key_context(r.trust_domain, r.id), fields=("trust_domain",)
    ),
    "sealed_signing_keys": sealed_column(
        "signing_keys", "sealed_key", lambda r: signing_key_context(r.trust_domain, r.id), fields=("trust_domain",)
    ),
    "sealed_join_keys": sealed_column("join_keys", "sealed_key", lambda r: join_key_context(r.id)),
}
"""The adapters of this module's repositories, by ``Repository.name``."""
