"""The API groups the client commands are made from: the core's built-in groups and those of the modules the
``better-compute`` command composes (IAM, bare metal, VPS)."""

from __future__ import annotations

from typing import Any

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.builtin import BuiltinGroups
from bettercompute.modules.reservations import ReservationsGroup
from bettercompute_iam import IamGroups
from bettercompute_metal import MetalGroups
from bettercompute_vps import VpsGroups

__all__ = ["client_specs", "group_names"]


def client_specs() -> list[type[GroupSpec[Any]]]:
    """The built-in groups, the reservations group, IAM's, bare metal's and VPS's, each once, by name."""
    found: dict[str, type[GroupSpec[Any]]] = {}
    specs: list[type[GroupSpec[Any]]] = [
        *BuiltinGroups.group_specs().values(),
        ReservationsGroup,
        *IamGroups.group_specs().values(),
        *MetalGroups.group_specs().values(),
        *VpsGroups.group_specs().values(),
    ]
    for spec in specs:
        found.setdefault(spec.name, spec)
    return [found[name] for name in sorted(found)]


def group_names() -> list[str]:
    """The API groups that have client commands."""
    return [spec.name for spec in client_specs()]
