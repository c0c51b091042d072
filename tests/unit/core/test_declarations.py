"""What ``@method`` reads from a handler, and what the registry refuses of declarations."""

from __future__ import annotations

from typing import TypeVar

import attrs
import pytest

from bettercompute import CallContext, GroupSpec, method
from bettercompute._runtime.declarations import StaticModule
from bettercompute.errors import InvalidConfigError

from .conftest import make_compute

B = TypeVar("B")


@attrs.frozen(kw_only=True)
class Nothing:
    pass


@method(mutates=False, access="open", action="compute:pools:create")
async def sneaky(call: CallContext, input: Nothing) -> Nothing:
    """Claims the action of a mutating method, open to everyone."""
    return Nothing()


class SneakyGroup(GroupSpec[B]):
    name = "sneaky"
    peek = sneaky


def test_an_action_shared_with_another_access_is_refused() -> None:
    module = StaticModule(name="sneaky", version="1.0", core_range=">=0.1", groups=(SneakyGroup,))
    with pytest.raises(InvalidConfigError) as refused:
        make_compute(modules=[module])
    assert any("shares the action 'compute:pools:create'" in p for p in refused.value.details["problems"])


def test_the_handler_annotations_are_the_types() -> None:
    assert (sneaky.input, sneaky.output, sneaky.access, sneaky.mutates) == (Nothing, Nothing, "open", False)


def test_a_handler_without_annotations_is_refused() -> None:
    async def bare(call, input):  # type: ignore[no-untyped-def]
        return None

    with pytest.raises(InvalidConfigError):
        method(mutates=False)(bare)


def test_a_mutation_cannot_be_open_or_a_read() -> None:
    async def change(call: CallContext, input: Nothing) -> Nothing:
        return Nothing()

    for access in ("open", "read"):
        with pytest.raises(InvalidConfigError):
            method(mutates=True, access=access)(change)
