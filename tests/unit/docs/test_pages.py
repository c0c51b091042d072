"""What the pages say about the code stays true of it: the README opens with the two commands the Makefile runs,
every configuration key has its row in ``docs/configuration.md``, and every flag the command table of ``docs/cli.md``
names is one its command takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bettercompute_cli import app
from bettercompute_cli._config import ENV_PREFIX, KEYS
from bettercompute_cli._constants import OWN_COMMANDS

ROOT = Path(__file__).resolve().parents[3]


def test_the_readme_opens_with_make_dev_and_make_test() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = readme.split("```", 2)[1]
    assert [line.split()[:2] for line in first_block.strip().splitlines()] == [["make", "dev"], ["make", "test"]]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^dev: ", makefile, re.M) and re.search(r"^test: lint pytest$", makefile, re.M)
    lint = re.search(r"^lint: (.*)$", makefile, re.M)
    assert lint is not None and "check-site" in lint.group(1).split()  # `make test` builds the docs site


def test_every_configuration_key_has_its_row() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| `([A-Z_]+)` \|", page, re.M))
    assert sorted(rows) == sorted(KEYS)
    assert all(env == ENV_PREFIX + key.upper() for key, env in rows.items())


def _documented_commands() -> list[tuple[list[str], list[str]]]:
    """The command table's rows for the server's own commands: the command's words and the flags the row names."""
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    found = []
    for span in re.findall(r"^\| `better-compute ([^`]+)`", page, re.M):
        words = re.match(r"[a-z][a-z -]*", span)  # `<group> <method>` and the like are not one command
        command = words.group(0).split() if words else []
        if command and command[0] in OWN_COMMANDS:
            found.append((command, re.findall(r"--[a-z][a-z-]*", span)))
    return found


def test_the_command_table_lists_the_server_commands() -> None:
    assert {command[0] for command, _ in _documented_commands()} >= {"dev", "migrate", "serve", "iam", "mcp"}


@pytest.mark.parametrize(("command", "flags"), _documented_commands(), ids=lambda v: " ".join(v))
def test_the_command_table_names_only_flags_the_command_takes(command: list[str], flags: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert [flag for flag in flags if flag not in result.stdout] == []
