"""A small module used by the unit tests: a tenant-scoped method, a failing one, and a mutation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import attrs

from bettercompute import CallContext, GroupSet, GroupSpec, Job, ModuleContext, method
from bettercompute.ports import Migration, ResourceRef

B = TypeVar("B")


@attrs.frozen(kw_only=True)
class SayInput:
    tenant: str
    text: str
    times: int = 1


@attrs.frozen(kw_only=True)
class SayOutput:
    text: str
    caller: str


@attrs.frozen(kw_only=True)
class FailInput:
    reason: str = ""


calls: list[str] = []


@method(mutates=False, resource=lambda i: ResourceRef(type="echo", tenant=i.tenant))
async def say(call: CallContext, input: SayInput) -> SayOutput:
    calls.append(input.text)
    assert call.identity is not None
    return SayOutput(text=input.text * input.times, caller=call.identity.principal_id)


@method(mutates=True)
async def fail(call: CallContext, input: FailInput) -> SayOutput:
    # The text imitates a driver error that quotes SQL and a secret: neither may reach a caller or a log line.
    raise RuntimeError("SELECT secret_hash FROM credentials WHERE token = 'bcak_0123456789abcdef.s3cr3t'")


@method(mutates=False)
async def ping(call: CallContext, input: FailInput) -> SayOutput:
    await call.context.store.ping()
    return SayOutput(text="pong", caller="")


class EchoGroup(GroupSpec[B]):
    """A test group."""

    name = "echo"
    say = say
    fail = fail
    ping = ping


class EchoGroups(GroupSet[B]):
    """The test module's group, typed: ``EchoGroups(compute.api).echo``."""

    echo: EchoGroup[B]


@attrs.frozen(kw_only=True)
class EchoModule:
    name: str = "echo"
    version: str = "1.0.0"
    core_range: str = ">=0.1,<0.2"
    groups: Sequence[type[GroupSpec[Any]]] = (EchoGroup,)
    actions: Sequence[str] = ("compute:echo:say", "compute:echo:fail", "compute:echo:ping")
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(factory=dict)
    jobs: Sequence[Job] = ()

    async def start(self, context: ModuleContext) -> None:
        return None

    async def stop(self) -> None:
        return None
