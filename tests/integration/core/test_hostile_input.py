"""Every registered input schema, over HTTP, with hostile text in every string field and map key.

The composition holds everything the project ships (built-in modules, webhooks and secrets with a KMS, the nodes
group with join settings, and IAM's groups), so a method added later is covered without an edit here. The caller is
the root admin, so requests get past IAM to the handlers and the store. Whatever the body, the answer is a 200 or a
4xx JSON envelope with a code: never a 5xx, never a body that is not JSON.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bettercompute import BetterCompute, JoinSettings, LocalKeyKms, MethodDef, Options, better_compute
from bettercompute.errors import ComputeError
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests.strategies import FUZZ, method_calls

pytestmark = [pytest.mark.pg, pytest.mark.anyio]

TENANT = "tn_hostile000000001"
CODES = {cls.code for cls in ComputeError.__subclasses__()}


def compose(url: str, schema: str, key_file: Path) -> BetterCompute:
    return better_compute(
        Options(
            store=PgStore(url, schema=schema, pool_size=4),
            iam=EmbeddedIam(),
            kms=LocalKeyKms(key_file),
            join=JoinSettings(gateway_address="gw.hostile.example:443", trust_domain="hostile.example"),
        )
    )


@attrs.frozen(kw_only=True)
class Full:
    compute: BetterCompute
    http: httpx.AsyncClient
    root: str


@pytest.fixture
async def full(database_url: str, fresh_schema: str, tmp_path: Path) -> AsyncIterator[Full]:
    compute = compose(database_url, fresh_schema, tmp_path / "kms.key")
    await compute.initialize()
    try:
        iam = compute.options.iam
        assert isinstance(iam, EmbeddedIam)
        boot = await iam.bootstrap()
        assert boot.credential is not None
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'INSERT INTO "{fresh_schema}".iam_tenants (id, name) VALUES (%s, %s)', (TENANT, "hostile"))
        transport = httpx.ASGITransport(app=compute.asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield Full(compute=compute, http=http, root=boot.credential)
    finally:
        await compute.close()


# The tenant that exists, drawn often, so that the other fields' text gets past the tenant check to the store.
ANCHORS = {
    "tenant": st.just(TENANT),
    "url": st.just("https://hooks.example.com/in"),
    "scope": st.sampled_from(["node:n1", "pool:p1", "site:s1"]),
}


def _registry_methods() -> list[MethodDef[Any, Any]]:
    # Composed without a database, only to read the registry; the strategy is built before any event loop runs, as
    # Hypothesis must draw outside the test's event loop.
    compute = compose("postgresql://nobody@127.0.0.1:1/none", "unused", Path("/nonexistent/kms.key"))
    return list(compute.registry.methods())


METHODS = _registry_methods()


async def _check(full: Full, method: MethodDef[Any, Any], body: bytes) -> None:
    headers = {"authorization": f"Bearer {full.root}", "content-type": "application/json"}
    response = await full.http.post(f"{full.compute.endpoint}{method.path}", headers=headers, content=body)
    where = f"{method.group}.{method.name} answered {response.status_code}: {response.text[:300]}"
    assert response.headers["content-type"] == "application/json", where
    payload = response.json()
    if response.status_code == 200:
        assert "data" in payload, where
    else:
        assert 400 <= response.status_code < 500, where
        assert payload["error"]["code"] in CODES, where


@FUZZ
@given(call=method_calls(METHODS, ANCHORS, junk=False))
async def test_hostile_text_in_every_input_schema_gets_200_or_a_4xx_envelope(
    full: Full, call: tuple[MethodDef[Any, Any], bytes]
) -> None:
    await _check(full, *call)


@settings(FUZZ, max_examples=60)
@given(call=method_calls(METHODS, ANCHORS, junk=True))
async def test_junk_in_every_input_schema_gets_a_4xx_envelope(
    full: Full, call: tuple[MethodDef[Any, Any], bytes]
) -> None:
    await _check(full, *call)
