"""The inventory's repository (declared with the nodes' port, whose tables it hangs off): re-exported here."""

from bettercompute.modules.nodes._inventory_port import (
    INVENTORY,
    AtomRecord,
    ConditionRecord,
    DeviceRecord,
    Inventory,
)

__all__ = ["INVENTORY", "AtomRecord", "ConditionRecord", "DeviceRecord", "Inventory"]
