"""``PgStore`` through PgBouncer in transaction mode, with prepared statements off: the conformance suite again.

The test starts its own PgBouncer (Debian package ``pgbouncer``) on a free loopback port. Without the binary the
tests are skipped, except in CI (``CI`` set), where a missing binary is a failure.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from bettercompute.ports import Store, WorkItem
from bettercompute.testing import StoreConformance
from bettercompute_store_pg import PgStore

_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def _binary() -> str | None:
    found = shutil.which("pgbouncer")
    return found or next((path for path in _CANDIDATES if os.access(path, os.X_OK)), None)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _runner() -> str | None:
    """PgBouncer refuses to run as root: as root, run it as ``postgres`` (else ``nobody``)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            continue
    pytest.fail("running as root, and neither a postgres nor a nobody user exists to run pgbouncer")


@pytest.fixture(scope="module")
def pgbouncer_url(database_url: str) -> Iterator[str]:
    """A ``postgresql://`` URL through a PgBouncer in transaction mode in front of the test database."""
    binary = _binary()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("pgbouncer is not installed (apt-get install pgbouncer); CI must run this test")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    target = conninfo_to_dict(database_url)
    user = str(target.get("user") or "postgres")
    dbname = str(target.get("dbname") or user)
    # The embedded server listens with a password; PgBouncer must pass it on (clients still log in by trust).
    password = f" password={target['password']}" if target.get("password") else ""
    port = _free_port()
    # Not pytest's tmp_path: that lives under a 0700 folder the unprivileged runner cannot enter.
    folder = Path(tempfile.mkdtemp(prefix="bc-pgbouncer-"))
    folder.chmod(0o755)
    (folder / "users.txt").write_text(f'"{user}" ""\n')
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{dbname} = host={target.get('host') or '127.0.0.1'} port={target.get('port') or 5432} "
        f"dbname={dbname} user={user}{password}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {folder / 'users.txt'}\n"
        "pool_mode = transaction\n"
        # Fewer server connections than the store has clients, so clients keep switching server connections.
        "default_pool_size = 2\n"
        "max_client_conn = 200\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    for path in folder.iterdir():
        path.chmod(0o644)
    process = subprocess.Popen(
        [binary, str(folder / "pgbouncer.ini")],
        user=_runner(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"postgresql://{user}@127.0.0.1:{port}/{dbname}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with psycopg.connect(url, connect_timeout=2, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    output = process.communicate()[0].decode(errors="replace")
                    pytest.fail(f"pgbouncer did not start:\n{output[-2000:]}")
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
        shutil.rmtree(folder, ignore_errors=True)


class TestPgStoreThroughPgBouncer(StoreConformance):
    @pytest.fixture
    async def store(self, pgbouncer_url: str, fresh_schema: str) -> AsyncIterator[Store]:
        # A migrated copy, as everywhere: install() through the pooler finds every migration recorded.
        store = PgStore(pgbouncer_url, schema=fresh_schema, pool_size=4, prepared_statements=False)
        await store.open()
        try:
            assert await store.install() == []
            yield store
        finally:
            await store.close()

    async def test_a_fresh_schema_migrates_through_the_pooler(self, pgbouncer_url: str, empty_schema: str) -> None:
        # Every migration from nothing, as a first deployment behind PgBouncer runs them.
        store = PgStore(pgbouncer_url, schema=empty_schema, pool_size=2, prepared_statements=False)
        await store.open()
        try:
            assert await store.install() == [m.version for m in PgStore.runtime_migrations()]
            assert await store.install() == []
            await store.queue.enqueue([WorkItem(kind="k", key="first")])
            assert await store.queue.pending() == 1
        finally:
            await store.close()

    async def test_repeated_statements_stay_unprepared(self, store: Store) -> None:
        # psycopg prepares a statement on its 5th run unless told not to; through a transaction-mode pooler the
        # next run lands on a server connection that never saw it. Concurrent clients sharing two server
        # connections make that happen at once with prepared statements on.
        async def hammer() -> None:
            for _ in range(15):
                await store.ping()
                assert await store.queue.pending() == 0

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(hammer)
