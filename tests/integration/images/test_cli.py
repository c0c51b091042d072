"""``better-compute images register --file PATH``: the SHA-256 and size of a local file computed by the command, the
image registered at its ``file://`` URL."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from ..cli.conftest import run_cli
from ..examples._serve import serving
from ..iam.conftest import TwoTenants, two_tenants

pytestmark = [pytest.mark.anyio, pytest.mark.pg]


@pytest.fixture
async def served(database_url: str, fresh_schema: str) -> AsyncIterator[tuple[TwoTenants, dict[str, str]]]:
    async with two_tenants(database_url, fresh_schema) as t, serving(t.compute.asgi, lifespan="off") as base:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BETTERCOMPUTE_") and k != "TOKEN"}
        yield t, {**env, "BETTERCOMPUTE_URL": base, "BETTERCOMPUTE_TOKEN": t.alice}


async def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await anyio.to_thread.run_sync(lambda: run_cli(env, *args))


async def test_register_a_local_file(served: tuple[TwoTenants, dict[str, str]], tmp_path: Path) -> None:
    t, env = served
    content = os.urandom(3 * 1024 * 1024 + 17)
    image = tmp_path / "disk images" / "ubuntu 24.04.img"
    image.parent.mkdir()
    image.write_bytes(content)
    common = ("images", "register", "--tenant", t.acme, "--kind", "disk", "--output", "json")
    done = await _run(env, *common, "--name", "ubuntu", "--file", str(image))
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["sha256"] == hashlib.sha256(content).hexdigest() and made["size"] == len(content)
    assert made["url"] == image.resolve().as_uri() and made["url"].startswith("file:///") and " " not in made["url"]
    assert made["format"] == "raw"

    # A checksum given that the file does not have, a URL besides the file, a file that is not there: refused
    # before anything is sent.
    for extra, said in [
        (("--sha256", "0" * 64), "sha256"),
        (("--url", "https://x.example/a.img"), "not both"),
    ]:
        refused = await _run(env, *common, "--name", "other", "--file", str(image), *extra)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
    missing = await _run(env, *common, "--name", "other", "--file", str(tmp_path / "nope.img"))
    assert missing.returncode == 2
    listed = json.loads((await _run(env, "images", "list", "--tenant", t.acme, "--output", "json")).stdout)
    assert [i["name"] for i in listed["images"]] == ["ubuntu"]
