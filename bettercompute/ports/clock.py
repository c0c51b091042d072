"""The wall clock."""

from __future__ import annotations

import datetime as dt
from typing import Protocol

__all__ = ["Clock"]


class Clock(Protocol):
    """Wall-clock time for the control plane (anchored to the database's clock by ``initialize()``)."""

    def now(self) -> dt.datetime:
        """Timezone-aware UTC now."""
        ...
