"""The ``secrets`` group's declaration (actions ``compute:secrets:<method>``)."""

from __future__ import annotations

from typing import TypeVar

from bettercompute._runtime.registry import GroupSpec
from bettercompute.modules.secrets import _service

B = TypeVar("B")


class SecretsGroup(GroupSpec[B]):
    """Secrets for nodes, pools and sites: sealed at rest, never returned."""

    name = "secrets"
    create = _service.create
    list = _service.list_secrets
    delete = _service.delete


ACTIONS = tuple(sorted(m.action for m in SecretsGroup.methods.values()))
