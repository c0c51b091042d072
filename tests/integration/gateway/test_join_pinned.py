"""``bcd join`` in its short form (``--ca-pin``: the bundle fetched from the gateway and trusted only if it matches)
and from a pinned configuration file, as real ``bcd`` processes against a real gateway."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import anyio
import pytest

import bettercompute_proto as wire
from bettercompute.modules.nodes import JOIN_TOKENS, CreatedJoinToken
from bettercompute_daemon._pin import bundle_pin

from .conftest import Wire
from .test_daemon import fake_inventory

pytestmark = [pytest.mark.anyio, pytest.mark.pg]

BCD = str(Path(sys.executable).parent / "bcd")


def printed(token: CreatedJoinToken, gw: Wire, *, short: bool = True) -> list[str]:
    """The printed command's arguments after ``bcd join``, dialing the test's gateway."""
    command = token.short_join_command if short else token.join_command
    assert command is not None
    args = shlex.split(command)
    assert args[:2] == ["bcd", "join"]
    args[args.index("--gateway") + 1] = f"127.0.0.1:{gw.port}"
    return args[2:]


def options(args: list[str]) -> dict[str, str]:
    """``--name value`` and ``--name=value`` pairs."""
    found: dict[str, str] = {}
    pending = None
    for arg in args:
        if pending is not None:
            found[pending], pending = arg, None
        elif "=" in arg:
            name, value = arg.split("=", 1)
            found[name] = value
        else:
            pending = arg
    return found


async def bcd(tmp_path: Path, *args: str, serial: str = "SN-PIN-1") -> tuple[int, str]:
    common = ["--state-dir", str(tmp_path / "bcd"), "--fake-inventory", str(fake_inventory(tmp_path, serial))]
    done = await anyio.run_process([BCD, *common, *args], check=False)
    return done.returncode, (done.stdout + done.stderr).decode()


async def uses_left(gw: Wire, token: CreatedJoinToken) -> int:
    record = await gw.fleet.store.repository(JOIN_TOKENS).get(token.id)
    assert record is not None
    return record.uses_left


async def test_the_gateway_answers_its_bundle_without_a_client_certificate(gw: Wire) -> None:
    channel = gw.channel()  # no client certificate
    try:
        reply = await wire.NodeStub(channel).trust_bundle(wire.TrustBundleRequest())
    finally:
        channel.close()
    assert reply.trust_bundle_pem == await gw.fleet.services.trust_bundle_pem()


async def test_the_short_command_joins_with_the_bundle_its_pin_names(gw: Wire, tmp_path: Path) -> None:
    token = await gw.fleet.token()
    assert token.ca_pin is not None and token.short_join_command is not None
    assert f"--ca-pin {token.ca_pin}" in token.short_join_command and "--ca-bundle" not in token.short_join_command
    assert token.ca_pin == bundle_pin(gw.trust_bundle_pem)  # the control plane's pin is the daemon's
    code, output = await bcd(tmp_path, "join", *printed(token, gw))
    assert code == 0, output
    assert "joined as node_" in output and token.token not in output
    assert bundle_pin((tmp_path / "bcd" / "ca-bundle.pem").read_text()) == token.ca_pin


async def test_a_pin_that_does_not_match_trusts_nothing_and_writes_nothing(gw: Wire, tmp_path: Path) -> None:
    token = await gw.fleet.token()
    args = printed(token, gw)
    assert token.ca_pin is not None
    wrong = token.ca_pin[:-1] + ("0" if token.ca_pin[-1] != "0" else "1")
    args[args.index("--ca-pin") + 1] = wrong
    code, output = await bcd(tmp_path, "join", *args)
    assert code == 1
    assert f"does not match the CA pin (its pin is {token.ca_pin}): not trusted, nothing written" in output
    assert "Traceback" not in output and token.token not in output
    assert not (tmp_path / "bcd").exists()
    assert await uses_left(gw, token) == 1  # the token was never sent

    args[args.index("--ca-pin") + 1] = "sha256:" + "\uff10" * 64  # full-width zeros
    code, output = await bcd(tmp_path, "join", *args)
    assert code == 1 and "--ca-pin: only printable ASCII is allowed" in output
    args[args.index("--ca-pin") + 1] = token.ca_pin.upper().replace("SHA256:", "sha256:")  # hex in either case
    code, output = await bcd(tmp_path, "join", *args)
    assert code == 0, output


async def test_a_pinned_config_file_equals_the_flags(gw: Wire, tmp_path: Path) -> None:
    token = await gw.fleet.token()
    args = printed(token, gw)
    flags = options(args)
    config = tmp_path / "join.json"
    pinned = {
        "gateway": flags["--gateway"],
        "trust_domain": flags["--trust-domain"],
        "pool": flags["--pool"],
        "join_key": flags["--join-key"],
        "ca_pin": flags["--ca-pin"],
    }
    config.write_text(json.dumps(pinned))

    # A flag that says otherwise than the file: refused before anything is sent or written.
    code, output = await bcd(tmp_path, "join", "--config", str(config), "--token", token.token, "--pool", "pool_x")
    assert code == 1 and "--pool says otherwise than pool in" in output
    assert not (tmp_path / "bcd").exists() and await uses_left(gw, token) == 1

    # The file, and a flag that repeats it.
    code, output = await bcd(
        tmp_path, "join", "--config", str(config), "--token", token.token, "--pool", flags["--pool"]
    )
    assert code == 0, output
    kept = json.loads((tmp_path / "bcd" / "config.json").read_text())
    assert kept == {k: v for k, v in pinned.items() if k != "ca_pin"}
