"""mypy proves the typed access: every built-in group on ``compute.api`` and on both clients, and a module's groups
through its own group set, have the input and output types of their declarations, with no cast; a wrong input or
an unknown group is a type error.

The snippets are checked by mypy itself (``mypy.api``, the project's configuration, ``--strict``), as a user's code
would be.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import mypy.api
import pytest

ROOT = Path(__file__).resolve().parents[3]

TYPED = """
from typing import assert_type

from bettercompute import ApiCall, AsyncClientCall, BetterCompute, ClientCall
from bettercompute.client import AsyncClient, Client
from bettercompute.modules.nodes import Node, RetireNodeInput
from bettercompute.modules.pools import CreatePoolInput, Pool
from bettercompute.modules.nodes import CreatedJoinToken, CreateJoinTokenInput
from bettercompute.modules.secrets import ListSecretsInput, ListSecretsOutput
from bettercompute.modules.system import VersionInput, VersionOutput
from bettercompute.modules.webhooks import ListDeliveriesInput, ListDeliveriesOutput
from bettercompute_iam import CreateTenantInput, IamGroups, Tenant


async def check(compute: BetterCompute, client: AsyncClient, blocking: Client) -> None:
    assert_type(compute.api.system.version, ApiCall[VersionInput, VersionOutput])
    assert_type(compute.api.pools.create, ApiCall[CreatePoolInput, Pool])
    assert_type(compute.api.join_tokens.create, ApiCall[CreateJoinTokenInput, CreatedJoinToken])
    assert_type(compute.api.webhooks.deliveries, ApiCall[ListDeliveriesInput, ListDeliveriesOutput])
    assert_type(compute.api.secrets.list, ApiCall[ListSecretsInput, ListSecretsOutput])
    assert_type(compute.api.nodes.retire, ApiCall[RetireNodeInput, Node])
    pool = await compute.api.pools.create("bcak_x", CreatePoolInput(tenant="t", name="n"), idempotency_key="k")
    assert_type(pool, Pool)
    assert_type(client.pools.create, AsyncClientCall[CreatePoolInput, Pool])
    assert_type(await client.pools.create(CreatePoolInput(tenant="t", name="n")), Pool)
    assert_type(blocking.join_tokens.create, ClientCall[CreateJoinTokenInput, CreatedJoinToken])
    assert_type(IamGroups(compute.api).tenants.create, ApiCall[CreateTenantInput, Tenant])
    assert_type(IamGroups(client).tenants.create, AsyncClientCall[CreateTenantInput, Tenant])
    assert_type(IamGroups(blocking).tenants.create, ClientCall[CreateTenantInput, Tenant])
"""

WRONG = """
from bettercompute import BetterCompute
from bettercompute.client import AsyncClient
from bettercompute.modules.pools import ListPoolsInput


async def check(compute: BetterCompute, client: AsyncClient) -> None:
    await compute.api.pools.create("bcak_x", ListPoolsInput(tenant="t"))
    await client.pools.create(ListPoolsInput(tenant="t"))
    compute.api.tenants
"""


def _mypy(source: str, tmp_path: Path) -> tuple[str, int]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(source))
    stdout, stderr, status = mypy.api.run(
        ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache"), str(snippet)]
    )
    return stdout + stderr, status


@pytest.mark.timeout(300)
def test_groups_are_typed_everywhere(tmp_path: Path) -> None:
    output, status = _mypy(TYPED, tmp_path)
    assert status == 0, output


@pytest.mark.timeout(300)
def test_a_wrong_input_or_an_unknown_group_is_a_type_error(tmp_path: Path) -> None:
    output, status = _mypy(WRONG, tmp_path)
    assert status == 1
    assert output.count("[arg-type]") == 2, output
    assert '"Api" has no attribute "tenants"' in output, output
