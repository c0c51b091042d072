"""Fixtures for every test: the anyio backend and the PostgreSQL URL."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

DATABASE_URL_ENV = "BETTERCOMPUTE_DATABASE_URL"


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Run ``pytest.mark.anyio`` tests on asyncio (the backend psycopg and SQLAlchemy support)."""
    return "asyncio"


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """``BETTERCOMPUTE_DATABASE_URL`` when set, else an embedded PostgreSQL server started for the session."""
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    if url:
        yield url
        return
    # Imported here so that tests which never touch PostgreSQL do not need the pg extra.
    from bettercompute_store_pg import EmbeddedPostgres

    with EmbeddedPostgres() as server:
        yield server.url


# Directories that hand the database URL on (to subprocesses, proxies, PgBouncer, a second server) run whole in
# the embedded phase: there a URL that loses its password or host fails only against the embedded server.
_HANDS_THE_URL_ON = (
    "tests/integration/cli/",
    "tests/integration/core/test_database_outage.py",
    "tests/integration/core/test_database_blip.py",
    "tests/integration/core/test_control_plane.py",
    "tests/integration/core/test_lifespan.py",
    "tests/integration/store_pg/",
    "tests/integration/iam_conformance/",
    "tests/unit/cli/",
    "tests/integration/worker/test_processes.py",
    "tests/integration/workflows/test_processes.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fixture-cover",
        action="store_true",
        help="run the directories that hand the database URL on, plus the fewest other tests that use every fixture",
    )


def _fixtures(item: pytest.Item) -> set[tuple[str, str]]:
    """The fixture definitions ``item`` sets up, by where each is defined (two conftests may reuse a name)."""
    info = getattr(item, "_fixtureinfo", None)  # pytest keeps the resolved definitions here, on test functions
    if info is None:
        return set()
    return {(defs[-1].baseid, name) for name, defs in info.name2fixturedefs.items() if defs}


# The files that take longest (a schemathesis run, the CLI's subprocesses) come first: with the files spread over
# workers (``make test``), one that starts last would run on alone after every other worker has finished.
_START_FIRST = (
    "tests/integration/schemathesis/",
    "tests/integration/cli/",
    "tests/integration/iam_matrix/",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long files first; with ``--fixture-cover``, keep a subset that still sets up every fixture at least once."""
    items.sort(key=lambda item: not item.nodeid.startswith(_START_FIRST))  # stable: the order within stays
    if not config.getoption("--fixture-cover"):
        return
    covered: set[tuple[str, str]] = set()
    keep: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in sorted(items, key=lambda it: not it.nodeid.startswith(_HANDS_THE_URL_ON)):
        names = _fixtures(item)
        if item.nodeid.startswith(_HANDS_THE_URL_ON) or not names <= covered:
            keep.append(item)
            covered |= names
        else:
            dropped.append(item)
    config.hook.pytest_deselected(items=dropped)
    kept = set(keep)
    items[:] = [item for item in items if item in kept]
