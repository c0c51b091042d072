"""The joins fleet (a control plane with JoinService, a manual clock, a pool), reused for commands and sessions."""

from ..joins.conftest import attestors, clock, fleet

__all__ = ["attestors", "clock", "fleet"]
