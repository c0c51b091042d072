"""``better-compute dev`` as a new user meets it: every command it prints under "Next" is run as printed, in a shell,
against the real process (``login`` first, which saves the exported TOKEN as a profile); then the client commands of
every group's main methods, their ``--output json`` parsed, and one error of each code with its exit status and a
single line on stderr. Everything runs in subprocesses, as typed."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests._timing import deadline

from .conftest import StartCli, dev_with_gateway, signal_masks

IN_SESSION = "A simulated node with 8 fake GPUs is in session: "


def _printed_commands(stdout: str) -> list[str]:
    """The commands under dev's "Next" (indented four spaces; a trailing backslash continues one)."""
    block = stdout.split("Next, with $TOKEN set:", 1)[1]
    commands: list[str] = []
    continued = False
    for line in block.splitlines():
        if not line.strip():
            if commands:
                continued = False
            continue
        if continued:
            commands[-1] += "\n" + line
        elif line.startswith("    "):
            commands.append(line.strip())
        elif commands and not line.startswith("  "):
            break  # the log again
        continued = line.endswith("\\")
    return commands


class Shell:
    """Commands run as a user types them: bash, the venv's bin first on PATH, a private config folder."""

    def __init__(self, env: dict[str, str], home: Path) -> None:
        bin_dir = str(Path(sys.executable).parent)
        self.env = {**env, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "XDG_CONFIG_HOME": str(home)}
        for name in ("BETTERCOMPUTE_URL", "BETTERCOMPUTE_TOKEN", "TOKEN", "BETTERCOMPUTE_PROFILE"):
            self.env.pop(name, None)

    def run(self, command: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command],
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=deadline(120),
            check=False,
        )


def _json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def _refused(done: subprocess.CompletedProcess[str], code: str, status: int) -> str:
    assert done.returncode == status, (done.returncode, done.stdout, done.stderr)
    first = done.stderr.splitlines()[0]
    assert first.startswith(f"error: {code}: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    return done.stderr


def _watch_until(shell: Shell, command: str, token: str, seen: str) -> tuple[int, str]:
    """Start a command that runs until Ctrl-C, wait for ``seen`` in its output, then press Ctrl-C."""
    process = subprocess.Popen(
        ["bash", "-c", command],
        env={**shell.env, "TOKEN": token, "PYTHONFAULTHANDLER": "1"},  # SIGABRT: where it was, should it hang
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # Ctrl-C goes to the terminal's foreground group: here, this one
    )
    assert process.stdout is not None
    out = ""
    ends = time.monotonic() + deadline(60)
    try:
        while seen not in out:
            assert time.monotonic() < ends, f"{seen!r} not in {out!r}"
            ready, _, _ = select.select([process.stdout], [], [], 1)
            if ready:
                line = process.stdout.readline()
                assert line, f"it ended: {out!r} {process.communicate()[1]!r}"
                out += line
        os.killpg(process.pid, signal.SIGINT)
        try:
            status = process.wait(timeout=deadline(20))
        except subprocess.TimeoutExpired:
            group = subprocess.run(["pgrep", "-g", str(process.pid)], capture_output=True, text=True).stdout.split()
            masks = {member: signal_masks(int(member)) for member in group}
            os.killpg(process.pid, signal.SIGABRT)
            where = process.communicate()[1][-8000:]
            raise AssertionError(f"still running after Ctrl-C ({masks}); its stderr:\n{where}") from None
        return status, out
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def _printed_commands_work(shell: Shell, commands: list[str], token: str, root: str, node_id: str) -> Path:
    """dev's commands, as printed, with the TOKEN set as dev says: ``login`` first; the saved profiles' file."""
    verbs = [re.sub(r"^BETTERCOMPUTE_URL=\S+ ", "", c).split()[:3] for c in commands]
    assert verbs == [
        ["better-compute", "login"],
        ["better-compute", "nodes", "watch"],
        ["better-compute", "reservations", "create"],
        ["better-compute", "capacity", "show"],
        ["better-compute", "reservations", "list"],
        ["better-compute", "join-tokens", "create"],
        ["curl", "-X", "POST"],
    ], commands
    login, watch, reserve, calendar, listing, join, curl = commands

    # login saves the exported TOKEN (checked against the server first) in a file only its owner may read.
    done = shell.run(login, TOKEN=token)
    assert done.returncode == 0, done.stderr
    assert "Logged in to" in done.stdout and f"tenant {root}" in done.stdout
    profiles = Path(shell.env["XDG_CONFIG_HOME"]) / "bettercompute" / "profiles.toml"
    assert stat.S_IMODE(profiles.stat().st_mode) == 0o600

    status, out = _watch_until(shell, watch, token, node_id)
    assert status == 0 and node_id in out.splitlines()[1], out

    done = shell.run(reserve, TOKEN=token)
    assert done.returncode == 0, done.stderr
    reserved = re.search(r"^id: (rsv_\S+)$", done.stdout, re.M)
    assert reserved is not None and re.search(r"^state: (bound|active)$", done.stdout, re.M), done.stdout
    progress = [line.split()[-1] for line in done.stderr.splitlines()]
    assert progress[:2] == ["placed", "bound"], done.stderr  # each transition shown, from its history

    done = shell.run(calendar, TOKEN=token)
    assert done.returncode == 0, done.stderr
    assert "8 atoms: 8 available, 7 free, 1 booked now" in done.stdout, done.stdout
    assert "booked per day" in done.stdout

    done = shell.run(listing, TOKEN=token)
    assert done.returncode == 0 and reserved[1] in done.stdout, done.stdout

    done = shell.run(join, TOKEN=token)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^    bcd join --token bcjt_\S+ --pool pool_\S+ ", done.stdout, re.M), done.stdout

    done = shell.run(curl, TOKEN=token)
    assert done.returncode == 0 and json.loads(done.stdout)["data"]["state"] == "placed", done.stdout
    return profiles


class Made(NamedTuple):
    """What the group commands made, for the error cases after them."""

    tenant: str
    dev_pool: dict[str, Any]
    reservation: dict[str, Any]
    credential: str


def _every_group_answers(shell: Shell, cli: str, root: str, node_id: str) -> Made:
    """Every group's main methods, as JSON."""
    version = _json(shell.run(f"{cli} system version --output json"))
    assert {m["name"] for m in version["modules"]} >= {"core", "iam"}
    tenant = _json(shell.run(f"{cli} tenants create --name acme --output json"))["id"]
    assert tenant in [t["id"] for t in _json(shell.run(f"{cli} tenants list --output json"))["tenants"]]
    pool = _json(shell.run(f"{cli} pools create --tenant {root} --name cli-pool --labels tier=a --output json"))
    assert pool["labels"] == {"tier": "a"}
    got = _json(shell.run(f"{cli} pools get --id {pool['id']} --output json"))
    assert got["name"] == "cli-pool"
    [dev_pool] = [
        p for p in _json(shell.run(f"{cli} pools list --tenant {root} --output json"))["pools"] if p["name"] == "dev"
    ]
    nodes = _json(shell.run(f"{cli} nodes list --tenant {root} --output json"))["nodes"]
    assert [n["id"] for n in nodes] == [node_id]
    devices = _json(shell.run(f"{cli} devices list --tenant {root} --node-id {node_id} --kind gpu --output json"))
    assert len(devices["devices"]) == 8
    cordoned = _json(shell.run(f"{cli} nodes cordon --id {node_id} --reason maintenance --output json"))
    assert cordoned["cordoned"] is True
    assert _json(shell.run(f"{cli} nodes uncordon --id {node_id} --output json"))["cordoned"] is False
    tokens = _json(shell.run(f"{cli} join-tokens list --pool-id {dev_pool['id']} --output json"))["tokens"]
    assert len(tokens) >= 2  # dev's own, and the one made above
    book = f"{cli} reservations create --tenant {root} --pool-id {dev_pool['id']}"
    made = _json(shell.run(f"{book} --gpus 1 --duration PT2H --output json"))
    assert _json(shell.run(f"{cli} reservations get --id {made['id']} --output json"))["gpus"] == 1
    explained = _json(shell.run(f"{cli} reservations explain --id {made['id']} --output json"))
    assert explained["nodes"][0]["node_id"] == node_id
    extended = _json(shell.run(f"{cli} reservations extend --id {made['id']} --duration PT3H --output json"))
    assert extended["end_at"] > made["end_at"]
    assert _json(shell.run(f"{cli} reservations cancel --id {made['id']} --output json"))["state"] == "cancelled"
    capacity = _json(shell.run(f"{cli} capacity get --pool-id {dev_pool['id']} --output json"))
    assert capacity["atoms"] == 8
    person = _json(shell.run(f"{cli} principals create --tenant {root} --name reader --kind user --output json"))
    mint = f"{cli} credentials create --tenant {root} --principal-id {person['id']} --expires-in-seconds 3600"
    minted = _json(shell.run(f"{mint} --output json"))
    assert minted["credential"].startswith("bcak_")
    quota = _json(
        shell.run(f"{cli} quotas set --pool-id {dev_pool['id']} --tenant {tenant} --max-gpus 1 --output json")
    )
    assert quota["max_gpus"] == 1
    hooks = _json(shell.run(f"{cli} webhooks list --tenant {root} --output json"))
    assert hooks["webhooks"] == []
    return Made(tenant=tenant, dev_pool=dev_pool, reservation=made, credential=minted["credential"])


def _one_error_of_each_code(shell: Shell, cli: str, root: str, made: Made) -> None:
    """The code and message on one line of stderr, and the exit status for it."""
    dev_pool = made.dev_pool
    base = f"{cli} reservations create --tenant {root} --pool-id {dev_pool['id']} --duration PT1H"
    _refused(shell.run(f"{cli} reservations get --id rsv_nope"), "NOT_FOUND", 6)
    _refused(shell.run(f"{base} --gpus 0"), "INVALID_INPUT", 3)
    _refused(shell.run(f"{cli} system whoami --token bcak_nope.nope"), "UNAUTHENTICATED", 4)
    _refused(shell.run(f"{cli} pools create --tenant {root} --name x --token {made.credential}"), "ACCESS_DENIED", 5)
    refused = _refused(shell.run(f"{base} --gpus 9"), "NO_CAPACITY", 9)
    assert "atoms left out, by reason: booked 2, free but too few for the shape asked 6" in refused, refused
    assert "nothing fits within 30 days" in refused
    over = f"{cli} reservations create --tenant {made.tenant} --pool-id {dev_pool['id']} --duration PT1H --gpus 2"
    _refused(shell.run(over), "QUOTA_EXCEEDED", 10)
    extend = f"{cli} reservations extend --id {made.reservation['id']} --duration PT4H"
    _refused(shell.run(extend), "FAILED_PRECONDITION", 8)
    keyed = f"{cli} pools create --tenant {root} --idempotency-key same-key"
    assert shell.run(f"{keyed} --name first").returncode == 0
    _refused(shell.run(f"{keyed} --name second"), "CONFLICT", 7)
    stopped = _refused(shell.run("better-compute system version --server http://127.0.0.1:1"), "UNAVAILABLE", 11)
    assert "cannot reach http://127.0.0.1:1" in stopped


@pytest.mark.e2e
@pytest.mark.timeout(600)  # dev's start, then some forty commands of a second or two each, on a loaded CI machine
def test_every_command_dev_prints_works_as_printed_and_every_group_answers(
    cli_env: dict[str, str], start_cli: StartCli, tmp_path: Path
) -> None:
    plane = dev_with_gateway(cli_env, start_cli, tmp_path)
    dev, root = plane.dev, plane.root_tenant
    dev.wait_for(IN_SESSION, timeout=60)
    node_id = dev.stdout.split(IN_SESSION, 1)[1].split(",", 1)[0]
    token = plane.headers["Authorization"].removeprefix("Bearer ")
    shell = Shell(cli_env, tmp_path / "config")
    url = f"http://127.0.0.1:{plane.port}"

    profiles = _printed_commands_work(shell, _printed_commands(dev.stdout), token, root, node_id)

    # Without TOKEN, the saved profile is used (dev's commands name its server with BETTERCOMPUTE_URL).
    cli = f"BETTERCOMPUTE_URL={url} better-compute"
    assert _json(shell.run(f"{cli} system whoami --output json"))["tenant_id"] == root
    made = _every_group_answers(shell, cli, root, node_id)
    _one_error_of_each_code(shell, cli, root, made)

    # login refuses a credential the server refuses, and saves nothing new.
    before = profiles.read_text()
    _refused(shell.run(f"{cli} login --profile bad --token bcak_nope.nope"), "UNAUTHENTICATED", 4)
    assert profiles.read_text() == before

    assert dev.stop() == 0
    assert "Traceback" not in dev.stderr
