"""Bare metal's tokens and the KMS contexts of what it seals, shared by its methods, its workflows and its gateway
methods.

- A site token (``bcst_<id>.<secret>``, ``site-tokens.create``) enrolls a site agent (``site.join``).
- A ramdisk token (``bcrt_<id>.<secret>``, minted by commissioning) lets a machine's ramdisk join
  (``ramdisk.join``); the site puts it on the ramdisk's kernel command line.
- A join token (the core's ``bcjt_``) lets the system a deploy installed join its pool.

Only a token's secret's SHA-256 is stored; what must be read back later (a ramdisk or join token, a BMC's
credentials) is sealed by the KMS under a context naming its machine, so it does not open on another row.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from bettercompute.modules.nodes import bundle_pin
from bettercompute.modules.nodes import new_token as new_node_token

__all__ = [
    "RAMDISK_TOKEN_PREFIX",
    "SITE_TOKEN_PREFIX",
    "bundle_pin",
    "credentials_context",
    "join_token_context",
    "new_join_token",
    "new_token",
    "parse_token",
    "token_context",
]

SITE_TOKEN_PREFIX = "bcst_"  # noqa: S105 - a token's prefix, not a secret
RAMDISK_TOKEN_PREFIX = "bcrt_"  # noqa: S105 - a token's prefix, not a secret


def new_token(prefix: str, id_prefix: str) -> tuple[str, str, bytes]:
    """A fresh ``(id, token, SHA-256 of its secret)``; show the token once, keep only the hash."""
    token_id = f"{id_prefix}{secrets.token_hex(10)}"
    secret = secrets.token_urlsafe(32)
    return token_id, f"{prefix}{token_id}.{secret}", hashlib.sha256(secret.encode()).digest()


def parse_token(token: Any, prefix: str) -> tuple[str, bytes] | None:
    """``(id, SHA-256 of the secret)`` of a well-formed token of ``prefix``, else ``None``."""
    if not isinstance(token, str) or not token.startswith(prefix) or len(token) > 200:
        return None
    token_id, dot, secret = token[len(prefix) :].partition(".")
    if not dot or not token_id.isascii() or not secret.isascii() or not token_id or not secret:
        return None
    if not all(c.isalnum() or c in "_-" for c in token_id + secret):
        return None
    return token_id, hashlib.sha256(secret.encode()).digest()


def new_join_token() -> tuple[str, str, bytes]:
    """A join token as ``join-tokens.create`` makes them (``bcjt_<id>.<secret>``): ``(id, token, secret hash)``."""
    return new_node_token()


def join_token_context(machine_id: str) -> str:
    """The KMS context of the join token a deploy writes into the installed system's cloud-init."""
    return f"metal-join-token:{machine_id}"


def credentials_context(machine_id: str) -> str:
    """The KMS context a machine's BMC credentials are sealed under: moved to another row, they won't open."""
    return f"metal-bmc:{machine_id}"


def token_context(machine_id: str) -> str:
    """The KMS context of a machine's current ramdisk token (the site puts it on the kernel command line)."""
    return f"metal-ramdisk-token:{machine_id}"
