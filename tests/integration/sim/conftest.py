"""``bcd sim`` as a real OS process against the real gateway and control plane of ``tests/integration/gateway``."""

from __future__ import annotations

from ..gateway.conftest import attestors, certificate_ttl, clock, fleet, gw, kms, modules

__all__ = ["attestors", "certificate_ttl", "clock", "fleet", "gw", "kms", "modules"]
