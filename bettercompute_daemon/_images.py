"""The daemon's content-addressed file cache: one directory, each file named by its SHA-256. ``bcd site`` keeps the
kernels, initrds and disk images it serves to bare metal in it, and ``bcd node`` the images of its VMs.

A file is downloaded to a temporary name in the same directory (``.part-<sha256>-<random>``) while its hash is
computed, checked against the name it should have (and its size, when the plan gives one), and only then renamed to
``<dir>/<sha256>``; a file that does not match is deleted and the caller gets a ``CacheError``. So a name in the
directory always holds the bytes it names. The download runs on ``urllib.request`` in a thread: the daemon has no
HTTP client of its own and does not need one for this.

``file://`` URLs: a cache made with ``file_dirs`` reads only files under those directories (after resolving
symbolic links and ``..``), so that a URL chosen by a tenant cannot make the daemon copy ``/etc/shadow`` into a VM's
disk; with ``file_dirs=[]`` it reads no local file at all. ``bcd site`` passes ``None`` (any local file): its boot
plan is the operator's.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

__all__ = ["CacheError", "CachedFile", "ChecksumMismatch", "FileCache", "FileRefused"]

log = logging.getLogger("bcd.images")

_CHUNK = 256 * 1024
_SCHEMES = frozenset({"http", "https", "file"})


class CachedFile(Protocol):
    """What the cache needs to know of a file: its name (SHA-256, lower-case hex), where it comes from, its size."""

    @property
    def sha256(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def size(self) -> int | None: ...


class CacheError(Exception):
    """A file could not be fetched, or what was fetched is not the file the plan names."""


class ChecksumMismatch(CacheError):
    """The fetched bytes are not the file named: another SHA-256, or another size."""


class FileRefused(CacheError):
    """The URL is one this cache does not fetch: another scheme, or a local file outside the allowed directories."""


class FileCache:
    """Files by SHA-256 in ``directory``; ``ensure`` fetches what is missing, once however many ask at the same time."""

    def __init__(self, directory: Path, *, timeout: float = 60.0, file_dirs: Sequence[Path] | None = None) -> None:
        self.directory = directory
        self.timeout = timeout
        self.file_dirs = None if file_dirs is None else [Path(os.path.realpath(d)) for d in file_dirs]
        self._fetching: dict[str, asyncio.Future[Path]] = {}
        directory.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path | None:
        """Where the file with this SHA-256 is, if the cache holds it."""
        path = self.directory / sha256
        return path if len(sha256) == 64 and path.is_file() else None

    async def ensure(self, file: CachedFile) -> Path:
        """The path of ``file`` in the cache, downloading and checking it first if it is not there yet.

        Raises:
            FileRefused: the URL is not one this cache fetches.
            ChecksumMismatch: the bytes do not hash to ``file.sha256`` (or differ in size).
            CacheError: the download failed.
        """
        present = self.path(file.sha256)
        if present is not None:
            return present
        pending = self._fetching.get(file.sha256)
        if pending is None:
            pending = asyncio.ensure_future(asyncio.to_thread(self._download, file))
            self._fetching[file.sha256] = pending
            pending.add_done_callback(lambda _: self._fetching.pop(file.sha256, None))
        # shield: one caller giving up (its request was cancelled) does not stop the download for the others
        return await asyncio.shield(pending)

    def _check_url(self, file: CachedFile) -> None:
        parts = urllib.parse.urlsplit(file.url)
        scheme = parts.scheme.lower()
        if scheme not in _SCHEMES:
            raise FileRefused(f"{file.sha256}: cannot fetch a {scheme or 'relative'} URL (http, https or file only)")
        if scheme != "file" or self.file_dirs is None:
            return
        if parts.netloc not in ("", "localhost"):
            raise FileRefused(f"{file.sha256}: a file URL must name a local file")
        local = Path(os.path.realpath(urllib.request.url2pathname(parts.path)))
        if not any(local.is_relative_to(allowed) for allowed in self.file_dirs):
            where = ", ".join(str(d) for d in self.file_dirs) or "none are configured"
            raise FileRefused(f"{file.sha256}: a file URL may name only files in the image directories ({where})")

    def _download(self, file: CachedFile) -> Path:
        self._check_url(file)
        target = self.directory / file.sha256
        temporary = self.directory / f".part-{file.sha256}-{secrets.token_hex(4)}"
        digest = hashlib.sha256()
        size = 0
        try:
            with urllib.request.urlopen(file.url, timeout=self.timeout) as response, temporary.open("wb") as out:  # noqa: S310 (scheme checked above)
                while chunk := response.read(_CHUNK):
                    size += len(chunk)
                    if file.size is not None and size > file.size:
                        raise ChecksumMismatch(
                            f"{file.sha256}: the download is larger than the {file.size} bytes expected"
                        )
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if file.size is not None and size != file.size:
                raise ChecksumMismatch(f"{file.sha256}: downloaded {size} bytes, expected {file.size}")
            if digest.hexdigest() != file.sha256:
                raise ChecksumMismatch(f"{file.sha256}: the downloaded bytes hash to {digest.hexdigest()} instead")
            os.replace(temporary, target)
        except CacheError:
            temporary.unlink(missing_ok=True)
            raise
        except (OSError, ValueError) as exc:  # urllib's errors are OSErrors; a malformed URL is a ValueError
            if isinstance(exc, urllib.error.HTTPError):
                exc.close()  # it holds the response's connection
            temporary.unlink(missing_ok=True)
            raise CacheError(f"{file.sha256}: download failed: {type(exc).__name__}: {exc}") from exc
        log.info("cached %s (%d bytes)", file.sha256, size)
        return target
