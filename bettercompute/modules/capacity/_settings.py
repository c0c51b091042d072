"""The capacity module's settings (``Options.capacity``)."""

from __future__ import annotations

from typing import Literal

import attrs

__all__ = ["CapacitySettings", "Placer"]

Placer = Literal["inline", "pool-lease"]


@attrs.frozen(kw_only=True)
class CapacitySettings:
    """How reservations are placed.

    Args:
        placer: ``inline`` (default): in admission's second transaction, so ``reservations.create`` answers
            ``placed`` (or ``NO_CAPACITY``). ``pool-lease``: by the ``placement`` reconciler of the ``scheduler``
            role, one pass per pool at a time (a pool's work item is only ever worked by the holder of its shard's
            lease), oldest request first; ``create`` answers ``pending`` and the reservation is ``placed`` (or
            ``failed`` with the reasons) as soon as a scheduler worker takes the item, woken by a poke.
    """

    placer: Placer = attrs.field(default="inline", validator=attrs.validators.in_(("inline", "pool-lease")))
