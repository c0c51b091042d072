"""The wire's messages and service as generated from ``protos/``, and the check that keeps the generated code in step
with them."""

from __future__ import annotations

import shutil
from pathlib import Path

import betterproto2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bettercompute_proto as wire
from bettercompute_proto import _regenerate

TEXT = st.text(max_size=50)
MS = st.integers(min_value=-(2**63), max_value=2**63 - 1)

NODE_FRAMES = st.one_of(
    st.builds(
        lambda n, s, v, c: wire.NodeFrame(
            hello=wire.Hello(node_id=n, session_nonce=s, software_version=v, capabilities=c)
        ),
        TEXT,
        st.binary(max_size=32),
        TEXT,
        st.lists(TEXT, max_size=4),
    ),
    st.builds(
        lambda s, c, f: wire.NodeFrame(inventory=wire.InventorySection(section=s, content_json=c, fake=f)),
        TEXT,
        TEXT,
        st.booleans(),
    ),
    st.builds(lambda t: wire.NodeFrame(heartbeat=wire.Heartbeat(sent_at_ms=t)), MS),
    st.builds(lambda g: wire.NodeFrame(desired_state_ack=wire.DesiredStateAck(observed_generation=g)), MS),
    st.builds(
        lambda i, k, o, r, e, sig: wire.NodeFrame(
            command_result=wire.CommandResult(command_id=i, kind=k, outcome=o, result_json=r, epoch=e, signature=sig)
        ),
        TEXT,
        TEXT,
        TEXT,
        TEXT,
        MS,
        st.binary(max_size=80),
    ),
    st.builds(lambda t, p, at: wire.NodeFrame(event=wire.NodeEvent(type=t, payload_json=p, at_ms=at)), TEXT, TEXT, MS),
)

CONTROL_FRAMES = st.one_of(
    st.builds(lambda e, h: wire.ControlFrame(welcome=wire.Welcome(epoch=e, heartbeat_interval_ms=h)), MS, MS),
    st.builds(
        lambda s: wire.ControlFrame(inventory_request=wire.InventoryRequest(sections=s)), st.lists(TEXT, max_size=5)
    ),
    st.builds(lambda g, c: wire.ControlFrame(desired_state=wire.DesiredState(generation=g, content_json=c)), MS, TEXT),
    st.builds(
        lambda i, k, a, d: wire.ControlFrame(command=wire.Command(id=i, kind=k, arguments_json=a, deadline_ms=d)),
        TEXT,
        TEXT,
        TEXT,
        MS,
    ),
    st.builds(lambda r, m: wire.ControlFrame(close=wire.Close(reason=r, message=m)), TEXT, TEXT),
)


# No deadline: the first example pays for building betterproto2's per-class caches (over half a second on a busy
# machine), which is not what these tests measure.
@settings(deadline=None)
@given(NODE_FRAMES)
def test_a_node_frame_reads_back_as_sent_with_the_one_kind_it_carries(frame: wire.NodeFrame) -> None:
    again = wire.NodeFrame.parse(bytes(frame))
    assert again == frame
    assert betterproto2.which_one_of(again, "frame")[0] == betterproto2.which_one_of(frame, "frame")[0]


@settings(deadline=None)
@given(CONTROL_FRAMES)
def test_a_control_frame_reads_back_as_sent_with_the_one_kind_it_carries(frame: wire.ControlFrame) -> None:
    again = wire.ControlFrame.parse(bytes(frame))
    assert again == frame
    assert betterproto2.which_one_of(again, "frame")[0] == betterproto2.which_one_of(frame, "frame")[0]


def test_the_service_has_its_eight_methods_under_a_package_no_python_package_uses() -> None:
    class Gateway(wire.NodeBase):
        pass

    paths = set(Gateway().__mapping__())
    assert paths == {
        f"/{wire.SERVICE}/{name}"
        for name in ("Join", "TrustBundle", "RenewChallenge", "Renew", "Secret", "Session", "Tunnel", "Call")
    }
    assert wire.SERVICE.split(".")[0] == "bcnode"


def test_the_drift_check_passes_on_the_committed_code_and_fails_on_a_changed_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _regenerate.check() == 0
    copy = tmp_path / "_generated"
    shutil.copytree(_regenerate.TARGET, copy, ignore=shutil.ignore_patterns("__pycache__"))
    module = copy / "bcnode" / "v1" / "__init__.py"
    module.write_text(module.read_text().replace("session_nonce", "session_salt", 1))
    monkeypatch.setattr(_regenerate, "TARGET", copy)
    assert _regenerate.check() == 1
    assert "make protos" in capsys.readouterr().err
