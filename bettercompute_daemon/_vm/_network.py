"""The node's VM network: one Linux bridge holding the gateway address of a /24, one tap per instance on it (an
isolated port: instances reach the node, not each other), and a stable address per instance, kept in
``<vm_dir>/addresses.json`` so that a restarted daemon gives the same instance the same address.

``bridge`` mode needs CAP_NET_ADMIN (root) and the ``ip`` tool. ``user`` mode (QEMU's user networking, for a daemon
that is not root) uses the same addresses inside QEMU's own network, whose gateway is the subnet's first address;
the host reaches an instance there only through forwarded ports on 127.0.0.1 (``Addresses.forwards``).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

__all__ = [
    "Addresses",
    "NetworkError",
    "bridge_name",
    "ensure_bridge",
    "ensure_tap",
    "is_isolated",
    "mac_of",
    "remove_tap",
    "tap_name",
]


class NetworkError(Exception):
    """The bridge or a tap could not be made, or the subnet has no free address."""


def bridge_name(node_id: str) -> str:
    """The node's bridge: ``bcbr`` and 10 hex digits of its id's hash (14 characters; Linux allows 15)."""
    return "bcbr" + hashlib.sha256(node_id.encode()).hexdigest()[:10]


def tap_name(instance_id: str) -> str:
    """An instance's tap: ``bct`` and 11 hex digits of its id's hash."""
    return "bct" + hashlib.sha256(instance_id.encode()).hexdigest()[:11]


def mac_of(instance_id: str) -> str:
    """A stable, locally administered MAC in QEMU's 52:54:00 range."""
    digest = hashlib.sha256(b"mac:" + instance_id.encode()).digest()
    return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


class Addresses:
    """Instance addresses in ``subnet``: the first host is the gateway (the bridge), the others are handed out
    lowest first and kept in ``path`` until released.

    Raises:
        NetworkError: (from ``assign``) every address is taken.
    """

    def __init__(self, path: Path, subnet: ipaddress.IPv4Network) -> None:
        self.path = path
        self.subnet = subnet
        hosts = list(subnet.hosts())
        self.gateway = str(hosts[0])
        self._pool = [str(h) for h in hosts[1:]]
        self._assigned: dict[str, str] = {}
        self._forwards: dict[str, dict[str, int]] = {}
        if path.exists():
            saved = json.loads(path.read_text())
            self._assigned = {k: v for k, v in saved.get("addresses", {}).items() if v in self._pool}
            self._forwards = saved.get("forwards", {})

    def get(self, instance_id: str) -> str | None:
        return self._assigned.get(instance_id)

    def assign(self, instance_id: str) -> str:
        """The instance's address, assigning the lowest free one the first time."""
        known = self._assigned.get(instance_id)
        if known is not None:
            return known
        taken = set(self._assigned.values())
        free = next((a for a in self._pool if a not in taken), None)
        if free is None:
            raise NetworkError(f"no free address left in {self.subnet}")
        self._assigned[instance_id] = free
        self._save()
        return free

    def forwards(self, instance_id: str, ports: tuple[int, ...]) -> dict[int, int]:
        """User mode: the host port on 127.0.0.1 forwarded to each guest port (kept, so a restart keeps them)."""
        kept = self._forwards.get(instance_id, {})
        result = {int(k): v for k, v in kept.items() if int(k) in ports}
        for port in ports:
            if port not in result:
                with socket.socket() as probe:  # a free port now; QEMU binds it moments later
                    probe.bind(("127.0.0.1", 0))
                    result[port] = probe.getsockname()[1]
        if result != {int(k): v for k, v in kept.items()}:
            self._forwards[instance_id] = {str(k): v for k, v in result.items()}
            self._save()
        return result

    def release(self, instance_id: str) -> None:
        if self._assigned.pop(instance_id, None) is not None or self._forwards.pop(instance_id, None) is not None:
            self._save()

    def _save(self) -> None:
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        temporary.write_text(json.dumps({"addresses": self._assigned, "forwards": self._forwards}, indent=2))
        os.replace(temporary, self.path)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("ip") or shutil.which("ip", path="/usr/sbin:/sbin")
    if tool is None:
        raise NetworkError("the ip tool (iproute2) is not installed")
    done = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30, check=False)  # noqa: S603
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done


def _exists(link: str) -> bool:
    return Path("/sys/class/net", link).exists()


def ensure_bridge(name: str, gateway: str, prefix: int) -> None:
    """Make the bridge (if missing), give it the gateway address (if missing) and bring it up.

    Raises:
        NetworkError: ``ip`` failed (not root, no bridge support).
    """
    network = ipaddress.IPv4Network(f"{gateway}/{prefix}", strict=False)
    for route in json.loads(_ip("-j", "route", "show").stdout or "[]"):
        destination, device = str(route.get("dst", "")), route.get("dev")
        if not destination or destination == "default" or device == name:
            continue
        try:
            taken = ipaddress.IPv4Network(destination, strict=False)
        except ValueError:
            continue
        if taken.overlaps(network):
            # Another link already routes these addresses: the node's instances would be unreachable (or another
            # link's hosts reached in their place). The operator picks another vm_subnet.
            raise NetworkError(f"vm_subnet {network} overlaps {taken} on {device}: choose another vm_subnet")
    if not _exists(name):
        _ip("link", "add", "name", name, "type", "bridge")
    shown = _ip("-j", "addr", "show", "dev", name).stdout
    addresses = {a.get("local") for link in json.loads(shown or "[]") for a in link.get("addr_info", [])}
    if gateway not in addresses:
        _ip("addr", "add", f"{gateway}/{prefix}", "dev", name)
    _ip("link", "set", name, "up")


def ensure_tap(name: str, bridge: str) -> None:
    """Make the instance's tap (if missing), put it on the bridge as an isolated port and bring it up.

    An isolated bridge port forwards only to ports that are not isolated: the bridge itself (the node, its gateway
    address) still reaches every instance and is reached by it, but one instance's frames never reach another's tap.
    The flag is set before the tap comes up, so no frame passes before it.

    Raises:
        NetworkError: ``ip`` failed (a kernel before 5.2 has no isolated ports: the tap is refused rather than left
        open to its neighbours).
    """
    if not _exists(name):
        _ip("tuntap", "add", "dev", name, "mode", "tap")
    _ip("link", "set", name, "master", bridge)
    _ip("link", "set", "dev", name, "type", "bridge_slave", "isolated", "on")
    _ip("link", "set", name, "up")


def is_isolated(name: str) -> bool:
    """Whether the tap is an isolated port of its bridge (``ip -d link show``)."""
    shown = json.loads(_ip("-j", "-d", "link", "show", "dev", name).stdout or "[]")
    return any(link.get("linkinfo", {}).get("info_slave_data", {}).get("isolated") is True for link in shown)


def remove_tap(name: str) -> None:
    """Remove a tap if it exists."""
    if _exists(name):
        _ip("link", "del", name, check=False)
