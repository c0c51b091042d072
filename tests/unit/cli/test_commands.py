"""The command's error paths that need no database: one line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import bettercompute
from bettercompute_cli import __version__, app
from bettercompute_cli._constants import OWN_COMMANDS
from bettercompute_cli._dev import path_hint


def _invoke(*args: str, **env: str) -> Result:
    # Start from no BETTERCOMPUTE_* variable at all, whatever the developer's shell has.
    environ: dict[str, str | None] = {k: None for k in os.environ if k.startswith("BETTERCOMPUTE_")}
    environ.update(env)
    return CliRunner().invoke(app, list(args), env=environ)


def _assert_clean_failure(result: Result, code: int) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: ")


@pytest.mark.parametrize("command", [["migrate"], ["serve"], ["iam", "bootstrap"], ["iam", "bootstrap", "--rotate"]])
def test_a_missing_database_url_names_the_variable(command: list[str]) -> None:
    result = _invoke(*command)
    _assert_clean_failure(result, 2)
    assert "BETTERCOMPUTE_DATABASE_URL" in result.stderr


def test_a_bad_config_file_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('prot = 3000\nport = "3000"\n')
    result = _invoke("--config", str(path), "migrate")
    _assert_clean_failure(result, 2)
    lines = result.stderr.splitlines()
    assert len(lines) == 2
    assert "unknown key 'prot'" in lines[0] or "unknown key 'prot'" in lines[1]
    assert any(f"{path}: port must be a port number" in line for line in lines)


def test_the_config_file_is_also_found_through_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("port = 0\n")
    result = _invoke("migrate", BETTERCOMPUTE_CONFIG=str(path))
    _assert_clean_failure(result, 2)
    assert f"{path}: port must be a port number" in result.stderr


def test_a_bad_port_flag_is_a_usage_error() -> None:
    result = _invoke("serve", "--port", "70000", BETTERCOMPUTE_DATABASE_URL="postgresql://u@127.0.0.1:1/x")
    _assert_clean_failure(result, 2)
    assert "--port must be a port number from 1 to 65535" in result.stderr


def test_the_gateway_role_needs_node_identity() -> None:
    result = _invoke("serve", "--roles", "api,gateway", BETTERCOMPUTE_DATABASE_URL="postgresql://u@127.0.0.1:1/x")
    _assert_clean_failure(result, 2)
    assert "the gateway role needs trust_domain and gateway_address" in result.stderr


def test_an_unknown_role_is_named() -> None:
    result = _invoke("serve", "--roles", "api,web", BETTERCOMPUTE_DATABASE_URL="postgresql://u@127.0.0.1:1/x")
    _assert_clean_failure(result, 2)
    assert "unknown role(s) web" in result.stderr


def test_a_malformed_database_url_hides_its_password() -> None:
    result = _invoke("migrate", BETTERCOMPUTE_DATABASE_URL="mysql://root:hunter2@db/x")
    _assert_clean_failure(result, 2)
    assert "hunter2" not in result.stderr


def test_a_bad_schema_is_a_usage_error() -> None:
    result = _invoke("migrate", BETTERCOMPUTE_DATABASE_URL="postgresql://u@db/x", BETTERCOMPUTE_SCHEMA="Nope")
    _assert_clean_failure(result, 2)
    assert "BETTERCOMPUTE_SCHEMA 'Nope' must be a lower-case identifier" in result.stderr


def test_version() -> None:
    result = _invoke("version")
    assert result.exit_code == 0
    assert result.stdout.splitlines()[:2] == [
        f"better-compute {__version__}",
        f"bettercompute {bettercompute.__version__}",
    ]


def test_help_lists_the_commands() -> None:
    result = _invoke("--help")
    assert result.exit_code == 0
    for command in ("migrate", "serve", "dev", "iam", "version"):
        assert command in result.stdout


_CREDENTIAL = "bcak_0000000000000000." + "s" * 43


def test_serve_with_an_iam_url_needs_the_credential_from_the_environment() -> None:
    result = _invoke(
        "serve", "--iam-url", "http://127.0.0.1:1", BETTERCOMPUTE_DATABASE_URL="postgresql://u@127.0.0.1:1/x"
    )
    _assert_clean_failure(result, 2)
    assert "iam_url is set but iam_credential is not" in result.stderr
    assert "BETTERCOMPUTE_IAM_CREDENTIAL" in result.stderr


def test_a_credential_without_an_iam_url_is_refused_and_not_echoed() -> None:
    result = _invoke(
        "serve", BETTERCOMPUTE_DATABASE_URL="postgresql://u@127.0.0.1:1/x", BETTERCOMPUTE_IAM_CREDENTIAL=_CREDENTIAL
    )
    _assert_clean_failure(result, 2)
    assert "iam_credential is set but iam_url is not" in result.stderr
    assert _CREDENTIAL not in result.stderr


def test_serve_has_no_credential_flag() -> None:
    result = _invoke("serve", "--help")
    assert result.exit_code == 0
    assert "--iam-url" in result.stdout
    assert "--iam-credential" not in result.stdout


def test_iam_bootstrap_refuses_a_central_iam_configuration() -> None:
    result = _invoke(
        "iam",
        "bootstrap",
        BETTERCOMPUTE_DATABASE_URL="postgresql://u@127.0.0.1:1/x",
        BETTERCOMPUTE_IAM_URL="http://iam.internal:3000",
        BETTERCOMPUTE_IAM_CREDENTIAL=_CREDENTIAL,
    )
    _assert_clean_failure(result, 2)
    assert "where IAM is embedded" in result.stderr
    assert _CREDENTIAL not in result.stderr


def test_an_unparsable_database_url_is_a_clean_error_without_its_password() -> None:
    # It starts with postgresql://, so only the parser finds the port that is not a number.
    result = _invoke("serve", BETTERCOMPUTE_DATABASE_URL="postgresql://u:hunter2@127.0.0.1:port/x")
    _assert_clean_failure(result, 1)
    assert result.stderr == "error: INVALID_CONFIG: the database URL cannot be parsed\n"


def test_a_lease_ttl_out_of_range_is_a_usage_error() -> None:
    result = _invoke(
        "serve", BETTERCOMPUTE_DATABASE_URL="postgresql://u@127.0.0.1:1/x", BETTERCOMPUTE_LEASE_TTL_SECONDS="0.5"
    )
    _assert_clean_failure(result, 2)
    assert (
        result.stderr
        == "error: BETTERCOMPUTE_LEASE_TTL_SECONDS must be a number of seconds from 1 to 3600, not '0.5'\n"
    )


def test_dev_says_how_to_reach_the_command_when_it_is_not_on_path(tmp_path: Path) -> None:
    venv = tmp_path / ".venv"
    command = venv / "bin" / "better-compute"
    command.parent.mkdir(parents=True)
    command.write_text("")
    base = tmp_path / "python"
    assert path_hint(str(command), command, venv, base) is None  # on PATH: the commands run as printed
    hint = path_hint(None, command, venv, base)  # `make dev`: PATH has no .venv/bin
    assert hint is not None and f"source {venv / 'bin' / 'activate'}" in hint
    other = tmp_path / "elsewhere" / "better-compute"
    hint = path_hint(str(other), command, venv, base)  # another install first on PATH
    assert hint is not None and "source" in hint
    assert "not on PATH" in str(path_hint(None, command, base, base))  # no virtual environment


def test_the_entry_point_knows_every_server_command() -> None:
    typer_names = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    typer_names |= {g.name or "" for g in app.registered_groups}
    assert set(OWN_COMMANDS) == typer_names


def test_the_tunnel_command_picks_the_method_by_the_ids_prefix() -> None:
    from bettercompute_cli._tunnel import TunnelError, tunnel_call

    assert tunnel_call("node_0123", 22) == ("nodes/tunnel", {"node_id": "node_0123", "port": 22})
    assert tunnel_call("inst_0123", 2222) == ("instances/tunnel", {"id": "inst_0123", "port": 2222})
    with pytest.raises(TunnelError, match="node_"):
        tunnel_call("pool_0123", 22)
