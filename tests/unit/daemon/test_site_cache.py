"""``bcd site``'s file cache: a file lands under its SHA-256 only if its bytes hash to it; a mismatch leaves nothing
behind; many callers asking for one file at once download it once."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bettercompute_daemon._site._cache import CacheError, FileCache
from bettercompute_daemon._site._plan import BootFile

pytestmark = pytest.mark.anyio

CONTENT = b"a kernel, or close enough\n" * 1000
SHA = hashlib.sha256(CONTENT).hexdigest()


@pytest.fixture
def origin() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server that serves CONTENT at /kernel slowly (0.3 s), and the paths it was asked for."""
    asked: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            time.sleep(0.3)
            if self.path != "/kernel":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(CONTENT)))
            self.end_headers()
            self.wfile.write(CONTENT)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


async def test_a_file_is_downloaded_once_however_many_ask(tmp_path: Path, origin: tuple[str, list[str]]) -> None:
    base, asked = origin
    cache = FileCache(tmp_path / "cache")
    file = BootFile(sha256=SHA, url=f"{base}/kernel", size=len(CONTENT))
    paths = await asyncio.gather(*(cache.ensure(file) for _ in range(5)))
    assert set(paths) == {tmp_path / "cache" / SHA}
    assert asked == ["/kernel"]
    assert (tmp_path / "cache" / SHA).read_bytes() == CONTENT
    assert await cache.ensure(file) == tmp_path / "cache" / SHA
    assert asked == ["/kernel"]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [SHA]


async def test_bytes_that_do_not_match_are_not_kept(tmp_path: Path, origin: tuple[str, list[str]]) -> None:
    base, _ = origin
    cache = FileCache(tmp_path / "cache")
    wrong = BootFile(sha256="0" * 64, url=f"{base}/kernel")
    with pytest.raises(CacheError, match="hash to"):
        await cache.ensure(wrong)
    short = BootFile(sha256=SHA, url=f"{base}/kernel", size=len(CONTENT) - 1)
    with pytest.raises(CacheError, match="larger than"):
        await cache.ensure(short)
    long = BootFile(sha256=SHA, url=f"{base}/kernel", size=len(CONTENT) + 1)
    with pytest.raises(CacheError, match="expected"):
        await cache.ensure(long)
    missing = BootFile(sha256=SHA, url=f"{base}/nothing")
    with pytest.raises(CacheError, match="download failed"):
        await cache.ensure(missing)
    assert list((tmp_path / "cache").iterdir()) == []
    assert cache.path("0" * 64) is None and cache.path(SHA) is None


async def test_file_urls_work_and_other_schemes_do_not(tmp_path: Path) -> None:
    source = tmp_path / "kernel"
    source.write_bytes(CONTENT)
    cache = FileCache(tmp_path / "cache")
    assert (await cache.ensure(BootFile(sha256=SHA, url=source.as_uri()))).read_bytes() == CONTENT
    with pytest.raises(CacheError, match="http, https or file only"):
        await cache.ensure(BootFile(sha256="1" * 64, url="ftp://example.com/kernel"))
    with pytest.raises(CacheError, match="http, https or file only"):
        await cache.ensure(BootFile(sha256="1" * 64, url="kernel"))
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [SHA]
