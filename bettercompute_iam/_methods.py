"""IAM's method groups: tenants, principals, credentials, roles, bindings (actions ``iam:<group>:<method>``)."""

from __future__ import annotations

from typing import Any

from bettercompute import GroupSpec

__all__ = ["IAM_GROUPS"]

IAM_GROUPS: tuple[type[GroupSpec[Any]], ...] = ()
