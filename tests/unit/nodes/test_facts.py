"""The canonical encodings of what a node signs: the core's (which checks) and the wire package's (which the daemon
signs with) are the same bytes, and no two different facts share one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import bettercompute_proto as wire
from bettercompute.modules.nodes import (
    command_message,
    command_result_message,
    desired_ack_message,
    desired_state_message,
    inventory_section_message,
)

_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
_RESULTS = st.fixed_dictionaries(
    {"command_id": _TEXT, "kind": _TEXT, "outcome": _TEXT, "result_json": _TEXT, "epoch": st.integers(0, 2**62)}
)


@given(_RESULTS)
def test_the_core_checks_the_bytes_the_daemon_signs(fields: dict[str, object]) -> None:
    assert command_result_message(**fields) == wire.command_result_message(**fields)  # type: ignore[arg-type]


@given(_RESULTS, _RESULTS)
def test_two_different_results_never_share_a_message(one: dict[str, object], other: dict[str, object]) -> None:
    if one != other:
        assert command_result_message(**one) != command_result_message(**other)  # type: ignore[arg-type]


_SECTIONS = st.fixed_dictionaries(
    {"section": _TEXT, "content_json": _TEXT, "fake": st.booleans(), "epoch": st.integers(0, 2**62)}
)
_ACKS = st.fixed_dictionaries({"generation": st.integers(0, 2**62), "epoch": st.integers(0, 2**62)})


@given(_SECTIONS, _ACKS)
def test_sections_and_acknowledgements_too(section: dict[str, object], ack: dict[str, object]) -> None:
    assert inventory_section_message(**section) == wire.inventory_section_message(**section)  # type: ignore[arg-type]
    assert desired_ack_message(**ack) == wire.desired_ack_message(**ack)  # type: ignore[arg-type]


@given(_SECTIONS, _SECTIONS, _ACKS, _ACKS)
def test_no_two_different_sections_or_acknowledgements_share_a_message(
    one: dict[str, object], other: dict[str, object], ack: dict[str, object], other_ack: dict[str, object]
) -> None:
    if one != other:
        assert inventory_section_message(**one) != inventory_section_message(**other)  # type: ignore[arg-type]
    if ack != other_ack:
        assert desired_ack_message(**ack) != desired_ack_message(**other_ack)  # type: ignore[arg-type]


_DESIRED = st.fixed_dictionaries(
    {"node_id": _TEXT, "generation": st.integers(-(2**63), 2**63 - 1), "content_json": _TEXT}
)
_COMMANDS = st.fixed_dictionaries(
    {
        "command_id": _TEXT,
        "node_id": _TEXT,
        "kind": _TEXT,
        "arguments_json": _TEXT,
        "deadline_ms": st.integers(-(2**63), 2**63 - 1),
    }
)


@given(_DESIRED, _DESIRED, _COMMANDS, _COMMANDS)
def test_the_daemon_checks_the_instruction_bytes_the_control_plane_signs(
    desired: dict[str, object], other: dict[str, object], command: dict[str, object], other_command: dict[str, object]
) -> None:
    assert desired_state_message(**desired) == wire.desired_state_message(**desired)  # type: ignore[arg-type]
    assert command_message(**command) == wire.command_message(**command)  # type: ignore[arg-type]
    if desired != other:
        assert desired_state_message(**desired) != desired_state_message(**other)  # type: ignore[arg-type]
    if command != other_command:
        assert command_message(**command) != command_message(**other_command)  # type: ignore[arg-type]
    assert desired_state_message(**desired) != command_message(**command)  # type: ignore[arg-type]
