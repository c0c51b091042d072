"""``docs/quickstart.md`` as a reader follows it: every command of its ``bash`` blocks is run, in order, in one shell,
against a real ``better-compute dev``, and must exit 0; some answers are checked too.

What the test does in the reader's place, and nothing else:

- it starts ``better-compute dev --ephemeral`` itself (on free ports, in a schema of its own) instead of the one
  block marked ``<!-- quickstart-test: skip (...) -->``, which must be nothing but ``make dev``;
- it sets ``TOKEN`` to the credential dev printed in its ``export TOKEN=...`` line, which the page tells the reader
  to paste, and ``BETTERCOMPUTE_URL`` to where this dev listens, and writes that address for
  ``http://127.0.0.1:3000`` in the commands (dev's default, which a test running beside others cannot take);
- it waits, as the page says to, until dev has printed that its node is in session, and until the node is adopted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests._timing import deadline

from ..cli.conftest import StartCli, dev_with_gateway

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "docs" / "quickstart.md"
DEFAULT_URL = "http://127.0.0.1:3000"
IN_SESSION = "A simulated node with 8 fake GPUs is in session: "

_BLOCK = re.compile(r"(<!-- quickstart-test: skip \([^\n]*\) -->\n)?```bash\n(.*?)```", re.S)
_SKIPPABLE = {"make dev"}
"""What a marked block may hold: only the command that starts dev, which the test replaces by starting it."""

EXPECTED: dict[str, str] = {
    "better-compute login": r"(?m)^Logged in to http://127\.0\.0\.1:\d+ as root-admin",
    "better-compute system version": r"(?m)^version: \d",
    "better-compute system whoami": r"(?m)^tenant_id: root$",
    "curl ": r'"tenant_id":"root"',
    "better-compute pools list --tenant root": r"(?m)\bdev\b",
    'echo "$POOL"': r"^pool_\w+\n$",
    "better-compute nodes list": r'"state": "adopted"',
    "better-compute devices list": r"GPU-",
    "better-compute capacity get": r"(?m)^free: 8$",
    "better-compute nodes watch": r"(?m)^\S+ +node_\w+ +pool_\w+ +adopted ",
    'better-compute reservations create --tenant root --pool-id "$POOL" --gpus 1 --duration PT1H --idempotency-key '
    "quickstart-1 --wait": r"(?m)^state: (bound|active)$",
    "better-compute capacity show": r"8 atoms: 8 available, 7 free, 1 booked now",
    # the first ask (placed), and the same again with --wait (above), which answers once the node has it
    'better-compute reservations create --tenant root --pool-id "$POOL" --gpus 1': r"(?m)^state: (placed|bound|act)",
    'echo "$RSV"': r"^rsv_\w+\n$",
    "better-compute reservations get": r"(?m)^state: (placed|bound|active)$",
    'better-compute reservations create --tenant root --pool-id "$POOL" --gpus 9': r"(?m)^exit status 9$",
    "better-compute reservations cancel": r"(?m)^state: cancelled$",
}
"""A command's beginning -> what its output must hold (a regular expression)."""


def blocks(text: str) -> list[tuple[bool, str]]:
    """The page's ``bash`` blocks in order: whether each is marked skipped, and its text."""
    return [(bool(marker), body) for marker, body in _BLOCK.findall(text)]


def commands(block: str) -> list[str]:
    """The commands of a block: its lines, continuation lines joined, blank and comment lines left out."""
    found: list[str] = []
    pending = ""
    for line in block.splitlines():
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        if line.strip() and not line.lstrip().startswith("#"):
            found.append(line.strip())
    assert not pending, f"a block ends in a continuation line: {block!r}"
    return found


def script(steps: list[str], url: str) -> str:
    """One shell script running ``steps`` in order, each between markers that give its output and exit status; the
    first that fails ends it."""
    lines = []
    for index, step in enumerate(steps):
        lines.append(f"printf '\\n@@step {index}\\n'; printf '\\n@@step {index}\\n' >&2")
        lines.append(step.replace(DEFAULT_URL, url))
        lines.append(f"rc=$?; printf '\\n@@exit {index} %d\\n' $rc; [ $rc -eq 0 ] || exit 100")
    return "\n".join(lines) + "\n"


def outputs(text: str, count: int) -> list[str]:
    """Each step's share of ``text`` (stdout or stderr of ``script``), by its marker."""
    parts = re.split(r"\n@@step (\d+)\n", text)
    found = [""] * count
    for index, part in zip(parts[1::2], parts[2::2], strict=True):
        found[int(index)] = re.sub(r"\n@@exit \d+ \d+\n", "", part)
    return found


@pytest.mark.e2e
@pytest.mark.timeout(240)  # dev's start, its node's adoption, then some twenty commands of about a second each
def test_the_quickstart_runs_as_written(cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path) -> None:
    page = QUICKSTART.read_text(encoding="utf-8")
    found = blocks(page)
    assert page.count("```bash") == len(found), "a bash block the test does not see"
    skipped = [command for marked, body in found if marked for command in commands(body)]
    assert skipped == ["make dev"] and set(skipped) <= _SKIPPABLE, skipped
    steps = [command for marked, body in found if not marked for command in commands(body)]
    assert DEFAULT_URL in page
    for beginning in EXPECTED:
        assert any(step.startswith(beginning) for step in steps), f"no command starts with {beginning!r}"

    plane = dev_with_gateway(cli_env, start_cli, tmp_path)
    plane.dev.wait_for(IN_SESSION, timeout=60)
    ends = time.monotonic() + deadline(60)
    while plane.call("nodes/list", {"tenant": plane.root_tenant})["nodes"][0]["state"] != "adopted":
        assert time.monotonic() < ends, "dev's node was not adopted within 60 s"
        time.sleep(0.2)
    token = plane.headers["Authorization"].removeprefix("Bearer ")
    assert f"export TOKEN={token}" in plane.dev.stdout  # what the reader pastes
    url = f"http://127.0.0.1:{plane.port}"

    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTERCOMPUTE_") and k != "TOKEN"}
    env |= {"TOKEN": token, "BETTERCOMPUTE_URL": url, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # login's profile is the test's own
    path = tmp_path / "quickstart.sh"
    path.write_text(script(steps, url))
    done = subprocess.run(
        ["/bin/bash", str(path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=deadline(100), check=False
    )
    out, err = outputs(done.stdout, len(steps)), outputs(done.stderr, len(steps))
    statuses = dict(re.findall(r"\n@@exit (\d+) (\d+)\n", done.stdout))
    for index, step in enumerate(steps):
        assert statuses.get(str(index)) == "0", (
            f"step {index} failed: {step}\n--- stdout\n{out[index]}\n--- stderr\n{err[index]}"
        )
        for beginning, pattern in EXPECTED.items():
            if step.startswith(beginning):
                assert re.search(pattern, out[index]), f"{step}\n--- stdout\n{out[index]}\n--- stderr\n{err[index]}"
    assert done.returncode == 0, done.stderr
    [refused] = [i for i, step in enumerate(steps) if "--gpus 9" in step]
    assert "error: NO_CAPACITY: " in err[refused]
    assert "Traceback" not in done.stderr

    # What the page says happened: one reservation (the retry with the key booked nothing), now cancelled, and the
    # pool's GPUs all free again.
    reservations = httpx.post(
        f"{url}/api/compute/reservations/list",
        headers=plane.headers,
        json={"tenant": plane.root_tenant},
        timeout=deadline(10),
    ).json()["data"]["reservations"]
    assert [(r["state"], r["gpus"]) for r in reservations] == [("cancelled", 1)], reservations
    [pool] = plane.call("pools/list", {"tenant": plane.root_tenant})["pools"]
    assert plane.call("capacity/get", {"pool_id": pool["id"]})["free"] == 8
    assert plane.dev.stop() == 0
