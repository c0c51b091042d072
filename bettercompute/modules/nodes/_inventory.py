"""Inventory as daemons report it: the latest content of each section of each node, kept as sent (the inventory
controller of a later release derives devices and conditions from it)."""

from __future__ import annotations

__all__ = ["INVENTORY_REPORTED", "INVENTORY_SECTIONS", "NODE_REPORTED"]

INVENTORY_SECTIONS = frozenset({"gpus", "cpu", "memory", "disks", "nics"})
"""The sections a daemon may report; any other is dropped (a node cannot grow the table without bound)."""
INVENTORY_REPORTED = "node.inventory_reported"
"""Published with each section kept (payload: node_id, section, fake)."""
NODE_REPORTED = "node.reported"
"""Published by a gateway for each event a daemon reports on its session (payload: node_id, type, payload, at_ms)."""
