"""A PgBouncer in transaction mode in front of a PostgreSQL server, as a real process (Debian package ``pgbouncer``).

Without the binary a test is skipped, except in CI (``CI`` set), where a missing binary is a failure.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from tests._timing import deadline

__all__ = ["pgbouncer_binary", "running_pgbouncer"]

_CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str:
    """The binary's path; skips the test without one (fails it in CI)."""
    found = shutil.which("pgbouncer") or next((p for p in _CANDIDATES if os.access(p, os.X_OK)), None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("pgbouncer is not installed (apt-get install pgbouncer); CI must run this test")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _runner() -> str | None:
    """PgBouncer refuses to run as root: as root, run it as ``postgres`` (else ``nobody``)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name).pw_name
    pytest.fail("running as root, and neither a postgres nor a nobody user exists to run pgbouncer")


@contextlib.contextmanager
def running_pgbouncer(
    database_url: str,
    *,
    pool_size: int = 2,
    max_clients: int = 200,
    log: Path | None = None,
    settings: Mapping[str, str] | None = None,
    users: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """Run PgBouncer (transaction mode, at most ``pool_size`` server connections) in front of ``database_url``'s
    server; yield the ``postgresql://`` URL through it, as ``database_url``'s user. Clients log in by trust, each as
    the server user of its own name: ``database_url``'s, or one of ``users`` (name: the server's password for it,
    which PgBouncer passes on; the process roles of ``better-compute migrate``, say). Its output goes to ``log``
    (default: a file in its own folder, removed afterwards); ``settings`` adds to its ``[pgbouncer]`` section."""
    binary = pgbouncer_binary()
    target = conninfo_to_dict(database_url)
    user = str(target.get("user") or "postgres")
    dbname = str(target.get("dbname") or user)
    logins = {user: str(target.get("password") or ""), **(users or {})}
    port = _free_port()
    # Not pytest's tmp_path: that lives under a 0700 folder the unprivileged runner cannot enter.
    folder = Path(tempfile.mkdtemp(prefix="bc-pgbouncer-"))
    folder.chmod(0o755)
    (folder / "users.txt").write_text("".join(f'"{name}" "{secret}"\n' for name, secret in logins.items()))
    (folder / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"{dbname} = host={target.get('host') or '127.0.0.1'} port={target.get('port') or 5432} "
        f"dbname={dbname} max_db_connections={pool_size}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {folder / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        f"max_client_conn = {max_clients}\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        + "".join(f"{key} = {value}\n" for key, value in (settings or {}).items())
    )
    for path in folder.iterdir():
        path.chmod(0o644)
    # Its log goes to a file: a pipe nobody reads fills up (64 KB) and then stops PgBouncer at its next log line,
    # which a server restart's burst of disconnections reaches within seconds.
    log = log or folder / "pgbouncer.log"
    with log.open("ab") as out:
        process = subprocess.Popen([binary, str(folder / "pgbouncer.ini")], user=_runner(), stdout=out, stderr=out)
    url = f"postgresql://{user}@127.0.0.1:{port}/{dbname}"
    try:
        ends = time.monotonic() + deadline(10)
        while True:
            try:
                with psycopg.connect(url, connect_timeout=2, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > ends:
                    process.kill()
                    process.wait()
                    pytest.fail(f"pgbouncer did not start:\n{log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=deadline(10))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)
