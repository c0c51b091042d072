"""The OpenAPI document holds to what the API does: a short schemathesis run with every check finds nothing.

The control plane (every module the project ships, IAM included) is served by uvicorn on loopback; schemathesis runs
as its own process against the served document, authenticated as the root admin. Requests valid by the document must
be accepted, requests that break it must be refused with a documented 4xx envelope, and no answer may be a 5xx.

The run is split so that pytest-xdist runs its parts side by side (the files are its unit): each
``test_operations_<k>.py`` runs the phases that test one operation at a time (examples, coverage, fuzzing) on every
``SHARES``-th operation, and ``test_stateful.py`` runs the stateful phase, which chains operations, on all of them.
Together they run every phase on every operation, as one run would.

Which answers count as accepting valid data (``positive_data_acceptance``): a 2xx, and the refusals a well-formed
request can still earn from the state it meets: 404 (``NOT_FOUND``, the id does not exist), 409 (``CONFLICT``,
``FAILED_PRECONDITION``), 403 (``ACCESS_DENIED``, ``QUOTA_EXCEEDED``) and 429. A 400 is never one of them: it says the
request broke a rule, and every rule is in the document.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import uvicorn

from bettercompute import JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute.modules.webhooks import WebhookSettings
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore
from tests._timing import deadline

# Bounded so the run takes about a minute on two cores: examples per operation and phase.
MAX_EXAMPLES = 3

SHARES = 3
"""How many ``test_operations_<k>.py`` files split the operations between them."""

PER_OPERATION = "examples,coverage,fuzzing"
"""The phases that test each operation on its own (all of schemathesis's phases but ``stateful``)."""


CONFIG = """
[checks.positive_data_acceptance]
# 401 only from authz.authenticate, whose answer about the credential it is asked to check is 401 when that one is
# unknown; the caller's own credential is valid throughout.
expected-statuses = ["2xx", "401", "403", "404", "409", "429"]
"""

# Rules a document cannot publish, so a request valid by the document may still be refused there: a webhook URL
# must be one the sender's HTTP client parses (its parser's verdict, not a pattern), a role's action patterns must
# match actions in the live catalog, and a list's cursor must be one that list returned (the document gives its
# alphabet and length; what it decodes to is the list's). A reservation's window depends on the moment it is asked
# (a start not in the past) and on the pool's quota (its longest reservation), and takes one of an end and a
# duration. An image's URL is checked by its parts (no user information, a normal file path; see
# ``bettercompute.modules.images.url_problem``), and its kernel and initrd must be images of the tenant. These
# operations run in a second pass with every check but that one.
UNPUBLISHED = [
    "/api/compute/webhooks/create",
    "/api/compute/images/register",
    "/api/compute/roles/create",
    "/api/compute/reservations/create",
    "/api/compute/reservations/extend",
]


def _paged(document: dict[str, Any]) -> list[str]:
    """The paths of the list methods: those whose input has a ``cursor``."""
    schemas = document["components"]["schemas"]
    found = []
    for path, item in document["paths"].items():
        body = item.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json", {})
        ref = body.get("schema", {}).get("$ref", "")
        if "cursor" in schemas.get(ref.rpartition("/")[2], {}).get("properties", {}):
            found.append(path)
    return found


def _compose(url: str, schema: str, key_file: Path) -> Options:
    return Options(
        store=PgStore(url, schema=schema, pool_size=4),
        iam=EmbeddedIam(),
        kms=LocalKeyKms(key_file),
        join=JoinSettings(gateway_address="gw.fuzz.example:443", trust_domain="fuzz.example"),
        # Nothing is delivered here (no worker runs), and a document cannot tell a private address from a public one.
        webhooks=WebhookSettings(allow_private_destinations=True),
    )


@pytest.fixture
def served(database_url: str, fresh_schema: str, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The base URL of a uvicorn server on loopback, and the root admin's credential."""
    key_file = tmp_path / "kms.key"

    async def bootstrap() -> str:
        compute = better_compute(_compose(database_url, fresh_schema, key_file))
        await compute.initialize()
        try:
            iam = compute.options.iam
            assert isinstance(iam, EmbeddedIam)
            boot = await iam.bootstrap()
            assert boot.credential is not None
            return boot.credential
        finally:
            await compute.close()

    root = anyio.run(bootstrap)
    compute = better_compute(_compose(database_url, fresh_schema, key_file))
    # TCP named, so that asyncio turns Nagle off on its connections (else ~40 ms a keep-alive request).
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    config = uvicorn.Config(compute.asgi, lifespan="on", log_level="warning", http="h11", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", root
    finally:
        server.should_exit = True
        thread.join(timeout=deadline(30))


def run_schemathesis(served: tuple[str, str], tmp_path: Path, *, phases: str, share: int | None) -> None:
    """Run schemathesis with every check on the operations of ``share`` (every one when None), in ``phases``:
    the operations whose refusals the document cannot publish in a second pass, without that check."""
    base, root = served
    st = shutil.which("st", path=os.path.dirname(sys.executable))
    assert st is not None, "schemathesis is in the dev extra"
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    command = [
        st,
        "--config-file",
        str(config),
        "run",
        f"{base}/api/compute/openapi.json",
        "--checks",
        "all",
        "--phases",
        phases,
        "--max-examples",
        str(MAX_EXAMPLES),
        "--header",
        f"Authorization: Bearer {root}",
        "--seed",
        "1",
        "--workers",
        "1",
        "--wait-for-schema",
        "30",
        "--request-timeout",
        "30",
    ]
    document = httpx.get(f"{base}/api/compute/openapi.json", timeout=deadline(30)).json()
    paged = _paged(document)
    assert "/api/compute/pools/list" in paged and "/api/compute/webhooks/deliveries" in paged
    refusable = {*UNPUBLISHED, *paged}
    operations = sorted(document["paths"])
    chosen = operations if share is None else operations[share::SHARES]
    passes = [
        ([p for p in chosen if p not in refusable], []),
        ([p for p in chosen if p in refusable], ["--exclude-checks", "positive_data_acceptance"]),
    ]
    ran = 0
    for paths, extra in passes:
        if not paths:
            continue
        ran += len(paths)
        result = subprocess.run(
            [*command, *_include(paths), *extra],
            capture_output=True,
            text=True,
            timeout=deadline(600),
            cwd=tmp_path,
            check=False,
        )
        if phases == "stateful" and extra and "No links for stateful testing" in result.stdout:
            continue  # no link leads from one of these operations to another: nothing to chain (a whole run skips it)
        assert result.returncode == 0, result.stdout[-20_000:] + result.stderr[-5_000:]
        assert "0 failures" in result.stdout or "passed" in result.stdout, result.stdout[-5_000:]
        tested = re.search(r"Tested: (\d+)", result.stdout)
        assert tested is not None, result.stdout[-5_000:]
        # Each operation, one at a time; the stateful phase, the operations that links lead to.
        assert int(tested.group(1)) == len(paths) if phases == PER_OPERATION else int(tested.group(1)) > 0
    assert ran == len(chosen)


def _include(paths: Sequence[str]) -> list[str]:
    return [arg for path in paths for arg in ("--include-path", path)]
