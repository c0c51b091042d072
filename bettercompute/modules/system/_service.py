"""The ``system`` group's logic."""

from __future__ import annotations

from bettercompute._runtime.registry import CallContext, method
from bettercompute._version import __version__
from bettercompute.modules.system._schemas import (
    HealthInput,
    HealthOutput,
    ModuleVersion,
    VersionInput,
    VersionOutput,
    WhoamiInput,
    WhoamiOutput,
)


@method(mutates=False, access="open")
async def version(call: CallContext, _: VersionInput) -> VersionOutput:
    """The version of the core and of every module."""
    modules = tuple(ModuleVersion(name=name, version=v) for name, v in call.context.module_versions)
    return VersionOutput(version=__version__, modules=modules)


@method(mutates=False, access="open")
async def whoami(call: CallContext, _: WhoamiInput) -> WhoamiOutput:
    """Who the credential belongs to."""
    identity = call.identity
    assert identity is not None, "whoami is an authenticated method"
    return WhoamiOutput(
        principal_id=identity.principal_id,
        principal_name=identity.principal_name,
        kind=identity.kind,
        tenant_id=identity.tenant_id,
        is_root=identity.is_root,
        credential_id=identity.credential_id,
    )


@method(mutates=False, access="open")
async def health(call: CallContext, _: HealthInput) -> HealthOutput:
    """Read-only health checks of this process and its dependencies."""
    return await call.context.self_check()
