"""``better_compute()``: synchronous, no I/O, and every configuration problem reported at once."""

from __future__ import annotations

from typing import Any, TypeVar

import pytest

from bettercompute import GroupSpec, MethodDef, Options, better_compute
from bettercompute._runtime.declarations import version_in_range
from bettercompute.errors import InvalidConfigError
from bettercompute.modules.system import VersionInput, VersionOutput

from ._echo import EchoGroup, EchoModule
from .conftest import make_compute, make_iam

B = TypeVar("B")


def _problems(options: Options) -> list[str]:
    with pytest.raises(InvalidConfigError) as info:
        better_compute(options)
    assert info.value.code == "INVALID_CONFIG"
    problems: list[str] = info.value.details["problems"]
    return problems


def test_every_problem_is_listed_at_once() -> None:
    problems = _problems(Options(endpoint="api/", max_in_flight=0, modules=[object()]))  # type: ignore[list-item]
    assert any(p.startswith("store:") for p in problems)
    assert any(p.startswith("iam:") for p in problems)
    assert any(p.startswith("endpoint:") for p in problems)
    assert any(p.startswith("max_in_flight:") for p in problems)
    assert any(p.startswith("modules[0]:") for p in problems)


def test_a_module_for_another_core_version_is_refused() -> None:
    problems = _problems(
        Options(store=make_compute().context.store, iam=make_iam(), modules=[EchoModule(core_range=">=2.0")])
    )
    assert problems == ["module 'echo' supports core >=2.0, but this core is 0.1.0"]


def test_a_malformed_range_is_refused() -> None:
    problems = _problems(
        Options(store=make_compute().context.store, iam=make_iam(), modules=[EchoModule(core_range="~1")])
    )
    assert "malformed" in problems[0]


def test_a_group_registered_twice_is_refused() -> None:
    store = make_compute().context.store
    problems = _problems(Options(store=store, iam=make_iam(), modules=[EchoModule(), EchoModule(name="echo2")]))
    assert problems == ["group 'echo' of 'echo2' is already registered by 'echo'"]


def test_two_modules_of_one_name_are_refused() -> None:
    store = make_compute().context.store
    problems = _problems(Options(store=store, iam=make_iam(), modules=[EchoModule(), EchoModule(groups=())]))
    assert problems == ["modules[1]: the name 'echo' is used twice"]


def test_a_module_may_not_take_the_name_its_store_migrates_the_runtime_under() -> None:
    # Its migrations would be numbered in the same sequence as the runtime's tables.
    store = make_compute().context.store
    problems = _problems(Options(store=store, iam=make_iam(), modules=[EchoModule(name="runtime")]))
    assert problems == ["modules[0]: the name 'runtime' is used twice"]


def test_a_valid_composition_registers_core_then_modules() -> None:
    compute = make_compute(modules=[EchoModule()])
    assert [g.name for g in compute.registry.groups()] == [
        "audit",
        "capacity",
        "devices",
        "echo",
        "images",
        "join-tokens",
        "keys",
        "nodes",
        "pools",
        "quotas",
        "reservations",
        "secrets",
        "system",
        "webhooks",
    ]
    assert compute.registry.owner("pools") == "pools"
    assert compute.registry.owner("join-tokens") == compute.registry.owner("nodes") == "nodes"
    assert compute.registry.owner("keys") == "nodes"
    assert compute.registry.owner("devices") == "inventory"
    assert compute.registry.owner("reservations") == "reservations"
    assert compute.registry.owner("images") == "images"  # the core's, with or without bare metal
    assert compute.registry.owner("quotas") == compute.registry.owner("capacity") == "capacity"
    assert compute.registry.owner("system") == "core"
    assert compute.registry.owner("audit") == "audit"
    assert compute.registry.owner("echo") == "echo"
    assert compute.registry.method("echo", "say") is EchoGroup.say
    assert compute.endpoint == "/api/compute"


def test_a_method_with_an_unsupported_input_is_refused_when_declared() -> None:
    with pytest.raises(InvalidConfigError, match="input type"):
        MethodDef(input=dict, output=VersionOutput, handler=_noop, mutates=False)


def test_a_malformed_action_is_refused_when_declared() -> None:
    with pytest.raises(InvalidConfigError, match="action"):
        MethodDef(input=VersionInput, output=VersionOutput, handler=_noop, mutates=False, action="Compute.Version")


def test_a_group_needs_a_valid_name() -> None:
    with pytest.raises(InvalidConfigError, match="needs a name"):

        class Unnamed(GroupSpec[B]):
            pass


def test_actions_default_to_the_group_and_method() -> None:
    class JoinTokens(GroupSpec[B]):
        name = "join-tokens"
        create_many = MethodDef(input=VersionInput, output=VersionOutput, handler=_noop, mutates=True)

    method = JoinTokens.methods["create-many"]
    assert method.action == "compute:join-tokens:create-many"
    assert method.path == "/join-tokens/create-many"
    assert JoinTokens.attr() == "join_tokens"


async def _noop(call: Any, input: Any) -> VersionOutput:
    return VersionOutput(version="", modules=())


@pytest.mark.parametrize(
    ("version", "spec", "ok"),
    [
        ("0.1.0", ">=0.1,<0.2", True),
        ("0.2.0", ">=0.1,<0.2", False),
        ("0.1.5", "==0.1.5", True),
        ("1.0", ">0.9", True),
        ("0.1.0+local", ">=0.1", True),
        ("0.1.0", "!=0.1", False),
    ],
)
def test_version_ranges(version: str, spec: str, ok: bool) -> None:
    assert version_in_range(version, spec) is ok


def test_the_catalog_holds_every_methods_action_without_the_module_listing_them() -> None:
    # A module lists only the actions it checks outside its methods; its methods' actions come from their declarations.
    compute = make_compute(modules=[EchoModule(actions=("compute:echo:replay",))])
    assert {"compute:echo:say", "compute:echo:fail", "compute:echo:ping", "compute:echo:replay"} <= compute.catalog()


def test_a_session_timeout_under_a_second_is_refused() -> None:
    import datetime as dt

    store = make_compute().context.store
    problems = _problems(Options(store=store, iam=make_iam(), session_timeout=dt.timedelta(milliseconds=500)))
    assert problems == ["session_timeout: must be at least one second"]
