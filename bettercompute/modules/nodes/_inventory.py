"""Inventory as daemons report it: the latest content of each section of each node, kept as sent (the inventory
controller derives devices, atoms and conditions from it: ``bettercompute.modules.inventory``)."""

from __future__ import annotations

import datetime as dt

from bettercompute._runtime.shards import SHARDS, shard_of
from bettercompute.ports import WorkItem

__all__ = [
    "ACKED_KIND",
    "INVENTORY_KIND",
    "INVENTORY_REPORTED",
    "INVENTORY_SECTIONS",
    "LIFECYCLE_KIND",
    "NODE_REPORTED",
    "acked_item",
    "inventory_item",
    "lifecycle_item",
]

INVENTORY_SECTIONS = frozenset({"gpus", "cpu", "memory", "disks", "nics", "vm"})
"""The sections a daemon may report (``vm``: what a node running VM instances offers them); any other is dropped (a
node cannot grow the table without bound)."""
INVENTORY_REPORTED = "node.inventory_reported"
"""Published with each section kept (payload: node_id, section, fake)."""
NODE_REPORTED = "node.reported"
"""Published by a gateway for each event a daemon reports on its session (payload: node_id, type, payload, at_ms)."""

INVENTORY_KIND = "inventory"
"""The inventory controller's work items (key: a node id): sections were reported, derive devices and atoms."""
LIFECYCLE_KIND = "node-lifecycle"
"""The lifecycle controller's work items (key: a node id): acceptance, quarantine, reachability."""
ACKED_KIND = "desired-acked"
"""Work items saying something that waits on a node should look at it again (key: the node id): a gateway enqueues
one when the daemon acknowledges a newer desired state (reservations bind), and retiring a node enqueues one (what
is booked on it fails)."""


def inventory_item(node_id: str) -> WorkItem:
    """The inventory controller's work item for ``node_id`` (enqueue it with the sections it should read)."""
    return WorkItem(kind=INVENTORY_KIND, key=node_id, shard=shard_of(node_id) % SHARDS)


def acked_item(node_id: str) -> WorkItem:
    """The work item saying node ``node_id`` acknowledged a newer desired state."""
    return WorkItem(kind=ACKED_KIND, key=node_id, shard=shard_of(node_id) % SHARDS)


def lifecycle_item(node_id: str, *, run_at: dt.datetime | None = None) -> WorkItem:
    """The lifecycle controller's work item for ``node_id`` (a session opened or was lost, a check ended, an
    operator asked for something)."""
    return WorkItem(kind=LIFECYCLE_KIND, key=node_id, shard=shard_of(node_id) % SHARDS, run_at=run_at)
