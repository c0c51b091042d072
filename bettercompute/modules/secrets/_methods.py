"""The ``secrets`` group's declaration (actions ``compute:secrets:<method>``)."""

from __future__ import annotations

from typing import Any, TypeVar

from bettercompute._runtime.registry import GroupSpec, MethodDef
from bettercompute.modules.secrets import _service
from bettercompute.modules.secrets._schemas import (
    CreateSecretInput,
    DeleteSecretInput,
    DeleteSecretOutput,
    ListSecretsInput,
    ListSecretsOutput,
    Secret,
)
from bettercompute.ports import ResourceRef

B = TypeVar("B")


def _tenant(input: Any) -> ResourceRef:
    # Every input names its tenant: the core's pre-check refuses another tenant's caller before the database.
    return ResourceRef(type="secret", id=getattr(input, "name", None), tenant=input.tenant)


class SecretsGroup(GroupSpec[B]):
    """Secrets for nodes, pools and sites: sealed at rest, never returned."""

    name = "secrets"
    create = MethodDef(input=CreateSecretInput, output=Secret, handler=_service.create, mutates=True, resource=_tenant)
    list = MethodDef(
        input=ListSecretsInput,
        output=ListSecretsOutput,
        handler=_service.list_secrets,
        mutates=False,
        resource=_tenant,
    )
    delete = MethodDef(
        input=DeleteSecretInput, output=DeleteSecretOutput, handler=_service.delete, mutates=True, resource=_tenant
    )


ACTIONS = tuple(sorted(m.action for m in SecretsGroup.methods.values()))
