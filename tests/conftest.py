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
