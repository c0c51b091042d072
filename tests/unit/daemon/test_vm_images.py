"""VM images in the daemon's cache: a ``file://`` URL is read only from the configured image directories (a tenant
cannot have ``/etc/shadow`` copied into a disk), bytes that do not hash to the name are refused, and an instance
whose image fails says why (``IMAGE_REFUSED``, ``IMAGE_CHECKSUM_MISMATCH``) without a VM being started."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from bettercompute_daemon._images import ChecksumMismatch, FileCache, FileRefused
from bettercompute_daemon._vm import ImageFile, QemuOptions, QemuRuntime, parse_instance

pytestmark = pytest.mark.anyio

DATA = b"a disk image\n" * 100


def _file(path: Path, data: bytes = DATA) -> ImageFile:
    return ImageFile(url=path.as_uri(), sha256=hashlib.sha256(data).hexdigest(), size=len(data))


@pytest.fixture
def images(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / "disk.raw").write_bytes(DATA)
    return folder


async def test_a_file_in_an_image_dir_is_cached(tmp_path: Path, images: Path) -> None:
    cache = FileCache(tmp_path / "cache", file_dirs=[images])
    path = await cache.ensure(_file(images / "disk.raw"))
    assert path.read_bytes() == DATA and path.parent == tmp_path / "cache"


async def test_files_outside_the_image_dirs_are_refused(tmp_path: Path, images: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_bytes(DATA)
    (images / "link.raw").symlink_to(secret)  # a link out of the directory does not make the file allowed
    cache = FileCache(tmp_path / "cache", file_dirs=[images])
    for path in (secret, images / "link.raw", images / ".." / "shadow", Path("/etc/shadow")):
        with pytest.raises(FileRefused, match="image directories"):
            await cache.ensure(_file(path))
    with pytest.raises(FileRefused):
        await FileCache(tmp_path / "cache2", file_dirs=[]).ensure(_file(images / "disk.raw"))
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == []


async def test_bytes_that_do_not_hash_to_the_name_are_refused_and_not_kept(tmp_path: Path, images: Path) -> None:
    cache = FileCache(tmp_path / "cache", file_dirs=[images])
    wrong = ImageFile(url=(images / "disk.raw").as_uri(), sha256="0" * 64, size=len(DATA))
    with pytest.raises(ChecksumMismatch, match="hash to"):
        await cache.ensure(wrong)
    short = ImageFile(url=(images / "disk.raw").as_uri(), sha256=hashlib.sha256(DATA).hexdigest(), size=len(DATA) + 1)
    with pytest.raises(ChecksumMismatch):
        await cache.ensure(short)
    assert list((tmp_path / "cache").iterdir()) == []


def _instance(url: str, sha256: str) -> dict[str, object]:
    return {
        "id": "inst_img",
        "spec": 1,
        "power": "running",
        "vcpu": 1,
        "memory_mib": 128,
        "disk_gib": 1,
        "hostname": "h",
        "image": {"id": "img", "url": url, "sha256": sha256, "size": len(DATA), "format": "raw"},
    }


async def test_an_instance_whose_image_fails_says_why(tmp_path: Path, images: Path) -> None:
    runtime = QemuRuntime(QemuOptions(vm_dir=tmp_path / "vm", image_dirs=(images,), qemu="/nonexistent/qemu"))
    refused = await runtime.apply(parse_instance(_instance("file:///etc/shadow", "1" * 64)))
    assert (refused.state, refused.reason) == ("failed", "IMAGE_REFUSED")
    mismatch = await runtime.apply(parse_instance(_instance((images / "disk.raw").as_uri(), "2" * 64)))
    assert (mismatch.state, mismatch.reason) == ("failed", "IMAGE_CHECKSUM_MISMATCH")
    assert runtime.status("inst_img") == mismatch
    await runtime.destroy("inst_img")
    assert runtime.known() == [] and runtime.status("inst_img") is None
