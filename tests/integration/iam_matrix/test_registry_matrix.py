"""The registry matrix: for every registered method, a principal lacking exactly that action is refused, and the
handler never runs. Generated from the registry, so the methods of modules added later are covered without edits.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import typing
import uuid
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings

from bettercompute import (
    BetterCompute,
    Intercepted,
    JoinSettings,
    LocalKeyKms,
    MethodDef,
    Next,
    Options,
    better_compute,
)
from bettercompute.errors import AccessDeniedError, ComputeError
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests.strategies import valid_inputs

from ._principals import add_principal

pytestmark = [pytest.mark.pg]

TENANT = "tn_matrix0000000001"
# Any authenticated principal may read these (as Kubernetes lets anyone read discovery); nothing else is exempt.
OPEN_TO_ALL = {"system.version", "system.whoami", "system.health"}


class Recorder:
    """A plugin: it sits after authorization, so anything it sees got past IAM."""

    name = "recorder"
    core_range = ">=0.1"
    actions: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def intercept(self, intercepted: Intercepted, next: Next) -> Any:
        call = intercepted.call
        self.seen.append(f"{call.method.group}.{call.method.name}")
        return await next(intercepted)


# A KMS makes the webhooks and secrets groups exist, and with join settings the nodes group (JoinService).
_KMS_DIR = Path(tempfile.gettempdir()) / f"bc-matrix-{uuid.uuid4().hex}"
_KMS = LocalKeyKms(_KMS_DIR / "kms.key")


def compose(url: str, schema: str, recorder: Recorder) -> BetterCompute:
    """Everything the project ships, so that every registered method is in the matrix."""
    return better_compute(
        Options(
            store=PgStore(url, schema=schema, pool_size=2),
            iam=EmbeddedIam(),
            plugins=[recorder],
            kms=_KMS,
            join=JoinSettings(gateway_address="gw.matrix.example:443", trust_domain="matrix.example"),
        )
    )


@attrs.frozen
class Matrix:
    compute: BetterCompute
    recorder: Recorder
    url: str
    schema: str

    def principal_with(self, patterns: list[str]) -> str:
        """A principal of TENANT bound on the root scope to a role of exactly ``patterns``; returns its credential."""
        return add_principal(self.url, self.schema, TENANT, patterns)


@pytest.fixture(scope="module")
def matrix(database_url: str) -> typing.Iterator[Matrix]:
    import anyio

    schema = f"bc_t_{uuid.uuid4().hex[:12]}"
    recorder = Recorder()
    compute = compose(database_url, schema, recorder)

    async def setup() -> None:
        await compute.initialize()
        await compute.close()

    anyio.run(setup)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{schema}".iam_tenants (id, name) VALUES (%s, %s)', (TENANT, "matrix"))
    try:
        yield Matrix(compute=compute, recorder=recorder, url=database_url, schema=schema)
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        shutil.rmtree(_KMS_DIR, ignore_errors=True)


def _methods() -> list[str]:
    # Composed without a database, only to read the registry.
    compute = compose("postgresql://nobody@127.0.0.1:1/none", "unused", Recorder())
    return [f"{m.group}.{m.name}" for m in compute.registry.methods()]


def _method(compute: BetterCompute, dotted: str) -> MethodDef[Any, Any]:
    group, name = dotted.split(".")
    method = compute.registry.method(group, name)
    assert method is not None
    return method


async def _call(compute: BetterCompute, credential: str, method: MethodDef[Any, Any], input: Any) -> None:
    # Each Hypothesis example runs in an event loop of its own, so the store is opened and closed around each call.
    await compute.initialize(migrate=False)
    try:
        spec = compute.registry.group(method.group)
        assert spec is not None
        await getattr(compute.api.group(spec), method.attr)(credential, input)
    finally:
        await compute.close()


def test_the_open_methods_are_only_the_system_reads() -> None:
    assert {m for m in _methods() if m.startswith("system.")} == OPEN_TO_ALL


@pytest.mark.parametrize("dotted", [m for m in _methods() if m not in OPEN_TO_ALL])
def test_a_principal_lacking_the_action_never_reaches_the_handler(matrix: Matrix, dotted: str) -> None:
    import anyio

    method = _method(matrix.compute, dotted)
    everything_else = sorted(matrix.compute.catalog() - {method.action})
    lacking = matrix.principal_with(everything_else)
    allowed = matrix.principal_with(["*:*:*"])

    @settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
    @given(input=valid_inputs(method.input, tenant=TENANT))
    def check(input: Any) -> None:
        matrix.recorder.seen.clear()
        with pytest.raises(AccessDeniedError):
            anyio.run(_call, matrix.compute, lacking, method, input)
        assert matrix.recorder.seen == []
        # The control: with the action, the same call gets past IAM, whatever the handler then makes of it.
        with contextlib.suppress(ComputeError):
            anyio.run(_call, matrix.compute, allowed, method, input)
        assert matrix.recorder.seen == [dotted]

    check()
