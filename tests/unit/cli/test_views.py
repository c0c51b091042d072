"""What ``nodes watch`` prints when piped (a line per node when it is new or changed, not on every look), and what
``capacity show`` draws (a day's share of the pool's GPU-hours, clipped days counted by their hours)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rich.console import Console

from bettercompute_cli._views import capacity_calendar, watch_nodes


def _node(state: str, epoch: int = 1, seen: str = "2026-12-04T10:00:00Z") -> dict[str, Any]:
    return {
        "id": "node_1",
        "pool_id": "pool_1",
        "state": state,
        "state_reason": None,
        "session_epoch": epoch,
        "last_seen_at": seen,
        "observed_generation": 2,
        "desired_generation": 2,
        "cordoned": False,
        "draining": False,
    }


def _watch(looks: list[list[dict[str, Any]] | None], output: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    answers = iter(looks)
    watch_nodes(lambda: next(answers), interval=0, count=len(looks), output=output, sleep=lambda _: None)
    return capsys.readouterr().out.splitlines()


def test_a_piped_watch_prints_a_node_again_only_when_it_changed(capsys: pytest.CaptureFixture[str]) -> None:
    looks: list[list[dict[str, Any]] | None] = [
        [_node("joined")],
        [_node("joined", seen="2026-12-04T10:00:05Z")],  # only its last contact moved: no line
        [_node("adopted")],
        [_node("adopted", epoch=2)],  # a new session
    ]
    lines = _watch(looks, "table", capsys)
    assert lines[0].split()[:4] == ["time", "node", "pool", "state"]
    assert [line.split()[3] for line in lines[1:]] == ["joined", "adopted", "adopted"]
    assert lines[-1].split()[4] == "2"


def test_a_watch_as_json_prints_one_object_per_change(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _watch([[_node("joined")], [_node("joined")], [_node("quarantined")]], "json", capsys)
    assert [json.loads(line)["node"]["state"] for line in lines] == ["joined", "quarantined"]


def test_a_watch_outlasts_an_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    answers = iter([[_node("joined")], None, None, [_node("adopted")]])
    watch_nodes(lambda: next(answers), interval=0, count=4, output="json", sleep=lambda _: None)
    out, err = capsys.readouterr()
    assert [json.loads(line)["node"]["state"] for line in out.splitlines()] == ["joined", "adopted"]
    assert err.splitlines() == ["the server cannot be reached; still trying", "the server answers again"]


def _render(data: dict[str, Any]) -> str:
    console = Console(width=160, record=True, color_system=None)
    console.print(capacity_calendar(data))
    return console.export_text()


def test_the_calendar_shows_each_days_share_of_the_available_gpu_hours() -> None:
    data = {
        "pool_id": "pool_1",
        "at": "2026-12-04T12:00:00Z",
        "start": "2026-12-04T12:00:00Z",
        "end": "2026-12-06T12:00:00Z",
        "atoms": 8,
        "available": 4,
        "free": 2,
        "booked": 2,
        "booked_gpus": 2.0,
        "unavailable": {"cordoned": 4},
        "gpu_hours": 72.0,
        "days": [
            {"day": "2026-12-04T00:00:00Z", "gpu_hours": 24.0, "by_model": {}},  # 12 h of the day: 24 / (4 x 12)
            {"day": "2026-12-05T00:00:00Z", "gpu_hours": 48.0, "by_model": {}},  # a whole day: 48 / (4 x 24)
            {"day": "2026-12-06T00:00:00Z", "gpu_hours": 0.0, "by_model": {}},
        ],
        "models": [
            {"model": "H100", "atoms": 8, "available": 4, "free": 2, "booked": 2, "gpu_hours": 72.0},
        ],
    }
    text = _render(data)
    assert "8 atoms: 4 available, 2 free, 2 booked now (2.0 GPUs); unavailable: cordoned 4" in text
    rows = {line.split()[2]: line for line in text.splitlines() if "2026-12-0" in line and "│" in line}
    assert rows["2026-12-04"].rstrip(" │").endswith("50%")
    assert rows["2026-12-05"].rstrip(" │").endswith("50%")
    assert rows["2026-12-06"].rstrip(" │").endswith("0%")
    assert rows["2026-12-04"].count("█") == 15
    assert "H100" in text
