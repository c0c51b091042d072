"""What ``bcd`` keeps on disk: its pinned configuration, its key and certificate, in a state directory only root reads.

Files (mode 0600, in a 0700 directory; each written to a temporary file and renamed, so a crash leaves the old one):

- ``config.json``: the gateway, trust domain, pool and JoinService key it was pinned to;
- ``ca-bundle.pem``: the node CA's trust bundle, as the control plane last sent it (join, renewal);
- ``pinned-ca.pem``: the bundle it was told to trust at ``bcd join`` (``--ca-bundle``, or fetched and checked
  against ``--ca-pin``); the gateway's certificate may chain to either (an operator's own gateway certificate
  chains to a CA of this one);
- ``node.key``: its private key (PEM);
- ``node.crt``: its certificate (PEM), ``node.json``: its node id, serial and expiry;
- ``renewal.key``: the new key of a renewal under way (``_renewal``);
- ``reenroll.token``: the join token ``bcd node`` joins again with once its certificate expired, when kept
  (``bcd join --keep-token``, or placed there by an operator).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs

__all__ = ["DEFAULT_STATE_DIR", "NodeConfig", "NodeIdentity", "StateDir"]

DEFAULT_STATE_DIR = Path("/var/lib/bcd")


@attrs.frozen(kw_only=True)
class NodeConfig:
    """Where the daemon connects and what it trusts, as ``bcd join`` was told."""

    gateway: str
    trust_domain: str
    pool: str | None
    join_key: str


@attrs.frozen(kw_only=True)
class NodeIdentity:
    """The node the daemon is, once joined."""

    node_id: str
    serial: str
    not_after_ms: int


class StateDir:
    """The daemon's state directory (made 0700 on first write).

    Args:
        path: Where it is.
        durable: Whether each write is synced to disk before it replaces the old file. ``bcd sim`` turns it off: its
            nodes' state is cheap to make again, and thousands of syncs would stall its one event loop.
    """

    def __init__(self, path: Path, *, durable: bool = True) -> None:
        self.path = path
        self.durable = durable

    def __repr__(self) -> str:
        return f"StateDir({str(self.path)!r})"

    def write(self, name: str, data: bytes) -> None:
        """Write ``name`` atomically, readable by its owner only."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)
        temporary = self.path / f".{name}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.path / name)

    def read(self, name: str) -> bytes:
        return (self.path / name).read_bytes()

    def save_config(self, config: NodeConfig) -> None:
        self.write("config.json", json.dumps(attrs.asdict(config), indent=2).encode())

    def config(self) -> NodeConfig:
        return NodeConfig(**_object(self.read("config.json")))

    def save_identity(self, identity: NodeIdentity, *, key_pem: bytes, certificate_pem: str, bundle_pem: str) -> None:
        """Keep a new identity: the key first, so that a certificate on disk always has its key beside it."""
        self.write("node.key", key_pem)
        self.write("node.crt", certificate_pem.encode())
        self.write("ca-bundle.pem", bundle_pem.encode())
        self.save_identity_record(identity)

    def save_identity_record(self, identity: NodeIdentity) -> None:
        """Write ``node.json`` alone (a renewal writes its certificate and key itself, in its own order)."""
        self.write("node.json", json.dumps(attrs.asdict(identity), indent=2).encode())

    def gateway_trust(self) -> str:
        """The CA certificates a gateway's certificate may chain to: the node CA's bundle and the pinned one."""
        bundle = self.read("ca-bundle.pem").decode()
        pinned = self.path / "pinned-ca.pem"
        return bundle + "\n" + self.read("pinned-ca.pem").decode() if pinned.exists() else bundle

    def identity(self) -> NodeIdentity | None:
        """The node this daemon is, or ``None`` before it joined."""
        if not (self.path / "node.json").exists():
            return None
        return NodeIdentity(**_object(self.read("node.json")))


def _object(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    if not isinstance(value, dict):
        raise ValueError("a state file is not a JSON object")
    return value
