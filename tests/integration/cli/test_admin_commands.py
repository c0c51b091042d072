"""``better-compute migrate`` and ``iam bootstrap`` against real PostgreSQL, run as a user runs them."""

from __future__ import annotations

import re

import anyio
import pytest

from bettercompute import Options, better_compute
from bettercompute.errors import UnauthenticatedError
from bettercompute.modules.system import WhoamiInput
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore

from .conftest import run_cli

pytestmark = pytest.mark.pg

TOKEN = re.compile(r"bcak_[0-9a-f]{16}\.[A-Za-z0-9_-]{43}")


def _whoami(url: str, schema: str, credential: str) -> str | None:
    """The principal behind ``credential`` in a fresh process-like control plane, or None if it is refused."""

    async def call() -> str | None:
        compute = better_compute(Options(store=PgStore(url, schema=schema, pool_size=2), iam=EmbeddedIam()))
        await compute.initialize(migrate=False)
        try:
            return (await compute.api.system.whoami(credential, WhoamiInput())).principal_id
        except UnauthenticatedError:
            return None
        finally:
            await compute.close()

    return anyio.run(call)


def test_migrate_twice_applies_everything_then_nothing(cli_env: dict[str, str]) -> None:
    schema = cli_env["BETTERCOMPUTE_SCHEMA"]
    first = run_cli(cli_env, "migrate")
    assert first.returncode == 0, first.stderr
    assert "runtime: applied 1" in first.stdout
    assert "pools: applied 1" in first.stdout
    assert "iam: applied 1" in first.stdout
    assert f"Schema {schema} is up to date." in first.stdout

    second = run_cli(cli_env, "migrate")
    assert second.returncode == 0, second.stderr
    roles = f"Roles: {schema}_api (api), {schema}_worker (worker roles), {schema}_gateway (gateway).\n"
    assert first.stdout.endswith(roles)
    assert second.stdout == f"Nothing to apply: schema {schema} is up to date.\n" + roles


def test_bootstrap_prints_only_the_token_once_and_rotate_replaces_it(
    cli_env: dict[str, str], database_url: str
) -> None:
    schema = cli_env["BETTERCOMPUTE_SCHEMA"]
    first = run_cli(cli_env, "iam", "bootstrap", "--output", "token")
    assert first.returncode == 0, first.stderr
    # Nothing but the token on stdout, so TOKEN=$(better-compute iam bootstrap --output token) works.
    assert TOKEN.fullmatch(first.stdout.removesuffix("\n"))
    token = first.stdout.strip()
    admin = _whoami(database_url, schema, token)
    assert admin is not None

    again = run_cli(cli_env, "iam", "bootstrap", "--output", "token")
    assert again.returncode == 1
    assert again.stdout == ""
    assert "nothing was minted" in again.stderr
    assert "--rotate" in again.stderr

    text = run_cli(cli_env, "iam", "bootstrap")
    assert text.returncode == 0
    assert "nothing was minted" in text.stdout
    assert "better-compute iam bootstrap --rotate" in text.stdout
    assert TOKEN.search(text.stdout) is None

    rotated = run_cli(cli_env, "iam", "bootstrap", "--rotate")
    assert rotated.returncode == 0, rotated.stderr
    assert "shown once" in rotated.stdout
    [new_token] = TOKEN.findall(rotated.stdout)
    assert new_token != token
    assert _whoami(database_url, schema, new_token) == admin
    assert _whoami(database_url, schema, token) is None


def test_an_unreachable_database_is_one_line_without_the_password(cli_env: dict[str, str]) -> None:
    env = {**cli_env, "BETTERCOMPUTE_DATABASE_URL": "postgresql://admin:hunter2@127.0.0.1:1/nowhere"}
    for args in (["migrate"], ["serve", "--port", "1"]):
        result = run_cli(env, *args)
        assert result.returncode == 1, (args, result.stderr)
        assert result.stdout == ""
        assert result.stderr.endswith("error: UNAVAILABLE: the database is unreachable\n"), result.stderr
        assert "hunter2" not in result.stderr
        assert "Traceback" not in result.stderr
