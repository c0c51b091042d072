"""The canonical encodings of what a node signs: the core's (which checks) and the wire package's (which the daemon
signs with) are the same bytes, and no two different facts share one."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import bettercompute_proto as wire
from bettercompute.modules.nodes import command_result_message

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
