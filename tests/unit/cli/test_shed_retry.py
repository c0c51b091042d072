"""A call the server shed (503, reason ``overloaded``, ``Retry-After``) is sent again after the server's delay, by the
command line and by the typed client alike; any other 503 is reported at once. The server is an httpx mock that
answers from a script; sleeping is recorded, not done."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from bettercompute.client import Client
from bettercompute.errors import UnavailableError
from bettercompute.modules.system import VersionInput
from bettercompute_cli import _call
from bettercompute_cli._profiles import Connection

SHED = httpx.Response(
    503,
    headers={"retry-after": "2"},
    json={
        "error": {
            "code": "UNAVAILABLE",
            "message": "the server is at capacity and did not run the call; retry after 2 s",
            "details": {"reason": "overloaded", "retry_after": 2},
            "retryable": True,
        }
    },
)
DOWN = httpx.Response(  # the database is down: the call may have started, so it is not resent blindly
    503,
    headers={"retry-after": "2"},
    json={"error": {"code": "UNAVAILABLE", "message": "the database cannot be reached", "details": {}}},
)
VERSION = {"version": "0.1.0", "modules": []}
OK = httpx.Response(200, json={"data": VERSION})


class Script:
    """Answers in order, each request and each sleep recorded."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.answers.pop(0)


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Script:
    script = Script()
    transport = httpx.MockTransport(script.answer)

    def post(url: str, **kwargs: Any) -> httpx.Response:
        kwargs.pop("timeout", None)
        with httpx.Client(transport=transport) as http:
            return http.post(url, **kwargs)

    monkeypatch.setattr("bettercompute_cli._call.httpx.post", post)
    monkeypatch.setattr("bettercompute_cli._call.time.sleep", script.sleeps.append)
    return script


CONNECTION = Connection(server="http://cp.test", token="bcak_x.y")


def test_the_cli_sends_a_shed_call_again_after_retry_after(script: Script) -> None:
    script.answers = [SHED, SHED, OK]
    assert _call.call_path(CONNECTION, "system/version", {}) == VERSION
    assert len(script.requests) == 3 and len(script.sleeps) == 2
    assert all(2 <= s <= 3 for s in script.sleeps)  # the server's delay at least, plus up to half of it as jitter
    assert {r.content for r in script.requests} == {b"{}"}


def test_the_cli_reports_a_call_shed_every_time(script: Script, capsys: pytest.CaptureFixture[str]) -> None:
    script.answers = [SHED] * (_call.SHED_RETRIES + 1)
    with pytest.raises(_call.Failed) as info:
        _call.call_path(CONNECTION, "system/version", {})
    assert info.value.code == "UNAVAILABLE" and info.value.status == _call.EXIT_CODES["UNAVAILABLE"]
    assert len(script.requests) == _call.SHED_RETRIES + 1
    info.value.show()
    err = capsys.readouterr().err
    assert "error: UNAVAILABLE: the server is at capacity and did not run the call; retry after 2 s" in err
    assert f"did not run the call (tried {_call.SHED_RETRIES + 1} times)" in err


def test_the_cli_does_not_resend_another_503(script: Script) -> None:
    script.answers = [DOWN]
    with pytest.raises(_call.Failed) as info:
        _call.call_path(CONNECTION, "system/version", {})
    assert info.value.code == "UNAVAILABLE" and len(script.requests) == 1 and script.sleeps == []


@pytest.mark.parametrize(("answers", "sent"), [([SHED, OK], 2), ([DOWN], 1)])
def test_the_typed_client_resends_only_shed_calls(
    monkeypatch: pytest.MonkeyPatch, answers: list[httpx.Response], sent: int
) -> None:
    script = Script(*answers)
    monkeypatch.setattr("bettercompute.client.time.sleep", script.sleeps.append)
    with Client("http://cp.test", "bcak_x.y", transport=httpx.MockTransport(script.answer)) as client:
        if answers[-1] is OK:
            assert client.system.version(VersionInput()).version == "0.1.0"
        else:
            with pytest.raises(UnavailableError):
                client.system.version(VersionInput())
    assert len(script.requests) == sent and len(script.sleeps) == sent - 1


def test_the_typed_client_gives_up_after_its_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script(SHED, SHED)
    monkeypatch.setattr("bettercompute.client.time.sleep", script.sleeps.append)
    transport = httpx.MockTransport(script.answer)
    client = Client("http://cp.test", "bcak_x.y", transport=transport, shed_retries=1)
    with client, pytest.raises(UnavailableError) as info:
        client.system.version(VersionInput())
    assert info.value.details == {"reason": "overloaded", "retry_after": 2}
    assert len(script.requests) == 2 and len(script.sleeps) == 1
