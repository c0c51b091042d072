"""Inputs and outputs of the ``system`` group."""

from __future__ import annotations

import attrs

from bettercompute._runtime.health import HealthCheck, HealthOutput

__all__ = [
    "HealthCheck",
    "HealthInput",
    "HealthOutput",
    "ModuleVersion",
    "VersionInput",
    "VersionOutput",
    "WhoamiInput",
    "WhoamiOutput",
]


@attrs.frozen(kw_only=True)
class VersionInput:
    """No fields."""


@attrs.frozen(kw_only=True)
class ModuleVersion:
    """A registered module and its version."""

    name: str
    version: str


@attrs.frozen(kw_only=True)
class VersionOutput:
    """The core's version and every registered module's."""

    version: str
    modules: tuple[ModuleVersion, ...]


@attrs.frozen(kw_only=True)
class WhoamiInput:
    """No fields."""


@attrs.frozen(kw_only=True)
class WhoamiOutput:
    """The identity behind the credential used."""

    principal_id: str
    principal_name: str
    kind: str
    tenant_id: str
    is_root: bool
    credential_id: str


@attrs.frozen(kw_only=True)
class HealthInput:
    """No fields."""
