"""The joins fleet (a control plane with JoinService, a manual clock, a pool), reused for commands and sessions."""

from ..joins.conftest import attestors, certificate_ttl, clock, fleet, kms, modules

__all__ = ["attestors", "certificate_ttl", "clock", "fleet", "kms", "modules"]
