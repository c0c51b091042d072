"""Saved connections for the client commands: ``better-compute login`` writes a server URL and a credential under a
profile name, and every client command (and ``better-compute mcp`` on stdio) reads them back.

The file is TOML, ``$XDG_CONFIG_HOME/bettercompute/profiles.toml`` (``~/.config/...`` without it), or the path in
``BETTERCOMPUTE_PROFILES``; it is written whole to a new file of mode 0600 in a folder of mode 0700, then renamed
over the old one, so a reader never sees half of it and nobody else may read the credentials.

Where a command's server and credential come from, first match wins:

1. ``--server`` / ``--token`` on the command line;
2. the profile named by ``--profile`` or ``BETTERCOMPUTE_PROFILE`` (naming one that is not saved is an error);
3. ``BETTERCOMPUTE_URL``, and ``BETTERCOMPUTE_TOKEN`` (or ``TOKEN``, as ``better-compute dev`` prints it);
4. the profile named ``default``, when saved;
5. ``http://127.0.0.1:3000`` and no credential.

So an exported ``TOKEN`` beats the default profile, and an explicit profile beats them both. A credential and a
server from different places are never paired by guess: a profile's credential goes to that profile's server only
(with ``--server`` or ``BETTERCOMPUTE_URL`` naming another, the command goes without one), and a credential given
on the command line or in the environment goes to the server given with it, else to ``http://127.0.0.1:3000``.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path

import attrs

__all__ = [
    "DEFAULT_PROFILE",
    "DEFAULT_SERVER",
    "PROFILES_ENV",
    "Connection",
    "ProfileError",
    "Profiles",
    "check_server",
    "check_token",
    "resolve",
]

DEFAULT_SERVER = "http://127.0.0.1:3000"
DEFAULT_PROFILE = "default"
PROFILES_ENV = "BETTERCOMPUTE_PROFILES"
PROFILE_ENV = "BETTERCOMPUTE_PROFILE"
URL_ENV = "BETTERCOMPUTE_URL"
TOKEN_ENVS = ("BETTERCOMPUTE_TOKEN", "TOKEN")

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Printable ASCII without spaces: what a URL or a bearer credential can hold, and nothing a TOML string must escape
# beyond the quote and the backslash (refused anyway).
_PRINTABLE = re.compile(r"[!-~]{1,4096}")


class ProfileError(Exception):
    """A profile that cannot be used or saved; the message says which and why (never a credential)."""


@attrs.frozen
class Connection:
    """Where a command sends its calls, and with what credential (``None``: none)."""

    server: str
    token: str | None = attrs.field(repr=False)
    profile: str | None = None
    """The saved profile the values came from, if any."""


def check_server(server: str) -> str:
    """The URL without a trailing slash, or ``ProfileError``: only ``http``/``https`` with a host, in printable
    ASCII (an internationalized host is given in its ``xn--`` form)."""
    if not _PRINTABLE.fullmatch(server) or '"' in server or "\\" in server:
        raise ProfileError("the server must be an http:// or https:// URL in printable ASCII, without spaces")
    scheme, sep, rest = server.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest.split("/", 1)[0]:
        raise ProfileError("the server must be an http:// or https:// URL with a host")
    return server.rstrip("/")


def check_token(token: str) -> str:
    """The credential, or ``ProfileError`` when it could not be one (it is not echoed)."""
    if not _PRINTABLE.fullmatch(token) or '"' in token or "\\" in token:
        raise ProfileError("the credential must be 1 to 4096 printable ASCII characters without spaces")
    return token


def _check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ProfileError("a profile name is 1 to 64 of A-Z, a-z, 0-9, '_' and '-'")
    return name


def default_path(env: Mapping[str, str]) -> Path:
    """Where the profiles are kept for this environment."""
    if env.get(PROFILES_ENV):
        return Path(env[PROFILES_ENV])
    base = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else Path.home() / ".config"
    return base / "bettercompute" / "profiles.toml"


@attrs.define
class Profiles:
    """The saved profiles: name → (server, credential)."""

    path: Path
    saved: dict[str, tuple[str, str]] = attrs.field(factory=dict, repr=False)

    @classmethod
    def load(cls, path: Path) -> Profiles:
        """Read the file (none yet: no profiles). ``ProfileError`` when it is not a profiles file."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ProfileError(f"{path}: cannot read it ({type(exc).__name__})") from None
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ProfileError(f"{path}: not TOML ({exc})") from None
        saved: dict[str, tuple[str, str]] = {}
        table = document.get("profiles", {})
        if not isinstance(table, dict):
            raise ProfileError(f"{path}: 'profiles' must be a table")
        for name, entry in table.items():
            server = entry.get("server") if isinstance(entry, dict) else None
            token = entry.get("token") if isinstance(entry, dict) else None
            if not isinstance(server, str) or not isinstance(token, str):
                raise ProfileError(f"{path}: profile {name!r} needs a server and a token, both text")
            saved[name] = (server, token)
        return cls(path, saved)

    def exposed(self) -> bool:
        """Whether the file can be read by anyone but its owner (it holds credentials)."""
        try:
            mode = self.path.stat().st_mode
        except OSError:
            return False
        return bool(mode & (stat.S_IRWXG | stat.S_IRWXO))

    def put(self, name: str, server: str, token: str) -> None:
        """Save (or replace) a profile and write the file."""
        self.saved[_check_name(name)] = (check_server(server), check_token(token))
        self._write()

    def remove(self, name: str) -> bool:
        """Forget a profile and write the file; whether it was saved."""
        if self.saved.pop(name, None) is None:
            return False
        self._write()
        return True

    def _write(self) -> None:
        lines = ["# Written by `better-compute login`: server URLs and credentials. Keep this file private (0600).", ""]
        for name in sorted(self.saved):
            server, token = self.saved[name]
            # Names, URLs and credentials were checked: printable ASCII without quotes or backslashes.
            lines += [f'[profiles."{name}"]', f'server = "{server}"', f'token = "{token}"', ""]
        folder = self.path.parent
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        temporary = folder / f".{self.path.name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write("\n".join(lines))
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise


def resolve(
    *, server: str | None, token: str | None, profile: str | None, env: Mapping[str, str], path: Path | None = None
) -> Connection:
    """The connection for one command (see the module's docstring for the order)."""
    profiles: Profiles | None = None

    def saved(name: str) -> tuple[str, str] | None:
        nonlocal profiles
        if profiles is None:
            profiles = Profiles.load(path or default_path(env))
        return profiles.saved.get(name)

    named = profile or env.get(PROFILE_ENV) or None
    env_server = env.get(URL_ENV) or None
    env_token = next((env[k] for k in TOKEN_ENVS if env.get(k)), None)
    if named is not None:
        entry = saved(named)
        if entry is None:
            where = path or default_path(env)
            raise ProfileError(
                f"no profile {named!r} in {where}; save one with: better-compute login --profile {named}"
            )
        chosen = server or entry[0]
        mine = chosen.rstrip("/") == entry[0].rstrip("/")
        return Connection(chosen, token or (entry[1] if mine else None), named)
    given_server, given_token = server or env_server, token or env_token
    if given_token is not None:  # never mixed with a saved server: a credential goes where it was meant for
        return Connection(given_server or DEFAULT_SERVER, given_token)
    entry = saved(DEFAULT_PROFILE)  # read only when needed: a damaged file cannot stop a command that names both
    if entry is None:
        return Connection(given_server or DEFAULT_SERVER, None)
    chosen = given_server or entry[0]
    if chosen.rstrip("/") != entry[0].rstrip("/"):
        return Connection(chosen, None)
    return Connection(chosen, entry[1], DEFAULT_PROFILE)
