"""``bcd ramdisk`` on this machine, without a control plane: its kernel command line and settings, the signed report,
and the tasks on disks that are temporary files (diagnose, wipe, deploy from a loopback HTTP server)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from bettercompute_daemon import main
from bettercompute_daemon._config import ConfigError
from bettercompute_daemon._disks import MIB, Disk, declared_disks, discover_disks, smart_health, wipe
from bettercompute_daemon._inventory import Inventory
from bettercompute_daemon._ramdisk import (
    Machine,
    Outcome,
    parse_cmdline,
    ramdisk_claims,
    resolve_settings,
    signed_report,
)
from bettercompute_daemon.identity import NodeKey, ramdisk_report_message

from ._http import serve

PIN = "sha256:" + "ab" * 32
TOKEN = "bcrt_abc.s3cret"


def fake_inventory(tmp_path: Path) -> Inventory:
    path = tmp_path / "inventory.json"
    path.write_text(
        json.dumps(
            {
                "claims": {"hostname": "m1", "serial": "SN-1", "system_uuid": "4C4C4544-0001", "product": "R760"},
                "sections": {"gpus": [{"uuid": "GPU-1", "model": "H100"}], "memory": {"bytes": 1024}},
            }
        )
    )
    return Inventory.load(path)


def disk_file(tmp_path: Path, size: int, fill: bytes = b"\xaa", name: str = "disk.img") -> Path:
    path = tmp_path / name
    with path.open("wb") as file:
        file.write(fill * size)
    return path


def machine(tmp_path: Path, *disks: Path, **kwargs: Any) -> Machine:
    return Machine(fake_inventory(tmp_path), disks=declared_disks(list(disks)), **kwargs)


# --- the kernel command line ----------------------------------------------------------------------------------------


def test_the_command_line_gives_its_bc_parameters() -> None:
    text = f"BOOT_IMAGE=/vmlinuz quiet bc.token={TOKEN} bc.gateway=gw.example.com:7443 bc.ca_pin={PIN} ip=dhcp\n"
    assert parse_cmdline(text) == {"bc.token": TOKEN, "bc.gateway": "gw.example.com:7443", "bc.ca_pin": PIN}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('bc.gateway="gw:1"', {"bc.gateway": "gw:1"}),
        ('"bc.gateway=gw:1" quiet', {"bc.gateway": "gw:1"}),
        ('bc.x="a b" bc.y=c', {"bc.x": "a b", "bc.y": "c"}),
        ('bc.x="unterminated and more', {"bc.x": "unterminated and more"}),
        ("bc.x=1 bc.x=2", {"bc.x": "2"}),  # the last one wins, as for the kernel's own parameters
        ("bc.x= bc.y", {"bc.x": ""}),  # a key without '=' is no parameter
        ("bc.=v bc bc.token junk==x =v", {}),
        ("", {}),
        ("\t\n  \n", {}),
    ],
)
def test_the_command_line_as_the_kernel_splits_it(text: str, expected: dict[str, str]) -> None:
    assert parse_cmdline(text) == expected


def test_a_nul_ends_a_word_and_a_quote() -> None:
    assert parse_cmdline('bc.token=bcrt_a\0bc.gateway="gw:1\0 bc.x=y') == {
        "bc.token": "bcrt_a",
        "bc.gateway": "gw:1",
        "bc.x": "y",
    }
    assert parse_cmdline("bc.gateway=gw\0\0:1") == {"bc.gateway": "gw"}


def test_settings_from_the_command_line_and_flags_winning() -> None:
    cmdline = parse_cmdline(f"bc.token={TOKEN} bc.gateway=gw.example.com:7443 bc.ca_pin={PIN.upper()[7:]}")
    with pytest.raises(ConfigError):  # the pin lacks its sha256: prefix
        resolve_settings({}, cmdline)
    cmdline["bc.ca_pin"] = PIN
    settings = resolve_settings({}, cmdline)
    assert (settings.token, settings.gateway, settings.ca_pin, settings.ca_bundle_pem) == (
        TOKEN,
        "gw.example.com:7443",
        PIN,
        None,
    )
    other = resolve_settings({"token": "bcrt_other.x", "gateway": "10.0.0.1:1"}, cmdline)
    assert (other.token, other.gateway, other.ca_pin) == ("bcrt_other.x", "10.0.0.1:1", PIN)


def test_settings_report_every_problem_and_never_the_token() -> None:
    with pytest.raises(ConfigError) as raised:
        resolve_settings({}, {})
    assert [p.split(":")[0] for p in raised.value.problems] == ["token", "gateway", "ca_pin"]
    with pytest.raises(ConfigError) as raised:
        resolve_settings({}, {"bc.token": "bcjt_join.token-secret", "bc.gateway": "gw", "bc.ca_pin": PIN})
    assert [p.split(":")[0] for p in raised.value.problems] == ["bc.token", "bc.gateway"]
    assert "token-secret" not in str(raised.value)
    with pytest.raises(ConfigError):  # a control character in the token
        resolve_settings({"token": "bcrt_a\x01b", "gateway": "gw:1", "ca_pin": PIN}, {})
    settings = resolve_settings({"token": TOKEN, "gateway": "gw:1", "ca_pin": PIN}, {})
    assert TOKEN not in repr(settings)


# --- claims and the signed report -----------------------------------------------------------------------------------


def test_claims_are_the_inventorys_with_system_uuid_and_serial(tmp_path: Path) -> None:
    inventory = fake_inventory(tmp_path)
    claims = ramdisk_claims(inventory)
    assert claims == {**inventory.claims, "system_uuid": "4c4c4544-0001"}
    bare = Inventory(claims={"hostname": "m2"}, sections={}, health={}, fake=True)
    assert ramdisk_claims(bare) == {"hostname": "m2", "system_uuid": None, "serial": None}


def test_the_report_message_is_the_prefix_and_the_canonical_json() -> None:
    message = ramdisk_report_message(
        machine_id="mach_1",
        task_id="task_1",
        kind="wipe",
        ok=True,
        result={"disks": [{"ok": True, "name": "sda", "method": "zero-head-tail"}], "\u00e9": 1.5},
        error=None,
        signed_at_ms=1_700_000_000_000,
    )
    assert message == (
        b"bettercompute/ramdisk-report/v1\n"
        b'{"error":null,"kind":"wipe","machine_id":"mach_1","ok":true,"result":{"disks":[{"method":"zero-head-tail",'
        b'"name":"sda","ok":true}],"\\u00e9":1.5},"signed_at_ms":1700000000000,"task_id":"task_1"}'
    )
    with pytest.raises(ValueError):
        ramdisk_report_message(
            machine_id="m", task_id="t", kind="k", ok=True, result={"x": float("nan")}, error=None, signed_at_ms=0
        )


def test_a_report_is_signed_by_the_key_over_the_exact_bytes() -> None:
    key = NodeKey()
    outcome = Outcome(ok=False, result={"disk": "sda", "written_bytes": 3, "sha256": "ab"}, error="checksum_mismatch")
    report = signed_report(key, machine_id="mach_1", task_id="task_9", kind="deploy", outcome=outcome, signed_at_ms=42)
    assert {k: v for k, v in report.items() if k != "signature"} == {
        "task_id": "task_9",
        "kind": "deploy",
        "ok": False,
        "result": outcome.result,
        "error": "checksum_mismatch",
        "signed_at_ms": 42,
    }
    signed = ramdisk_report_message(
        machine_id="mach_1", task_id="task_9", kind="deploy", ok=False, result=outcome.result, error=outcome.error,
        signed_at_ms=42,
    )  # fmt: skip
    public = key.private_key.public_key()
    public.verify(base64.b64decode(report["signature"]), signed, ec.ECDSA(hashes.SHA256()))
    with pytest.raises(InvalidSignature):  # another machine's bytes do not verify
        public.verify(
            base64.b64decode(report["signature"]), signed.replace(b"mach_1", b"mach_2"), ec.ECDSA(hashes.SHA256())
        )


# --- diagnose -------------------------------------------------------------------------------------------------------


def test_diagnose_on_files_reports_smart_as_unsupported(tmp_path: Path) -> None:
    disk = disk_file(tmp_path, 3 * MIB)
    ran = machine(tmp_path, disk, smartctl="/bin/true").run({"task_id": "t1", "kind": "diagnose", "params": {}})
    assert ran.ok and ran.error is None
    assert ran.result["claims"]["serial"] == "SN-1"
    assert ran.result["inventory"]["gpus"] == [{"uuid": "GPU-1", "model": "H100"}]
    assert ran.result["disks"] == [
        {"name": str(disk), "size_bytes": 3 * MIB, "smart": {"supported": False, "passed": None}}
    ]


def fake_smartctl(tmp_path: Path, output: dict[str, Any] | str, status: int = 0) -> str:
    script = tmp_path / "smartctl"
    body = output if isinstance(output, str) else json.dumps(output)
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{body}\nEOF\nexit {status}\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    ("output", "status", "expected"),
    [
        ({"smart_support": {"available": True, "enabled": True}, "smart_status": {"passed": True}}, 0, True),
        ({"smart_status": {"passed": False}}, 8, False),  # NVMe: no smart_support; status bit 3: failing
        ({"smart_support": {"available": False}, "smart_status": {"passed": True}}, 0, None),
        ({"smart_support": {"available": True}}, 4, None),  # no verdict
        ({"smart_status": {"passed": True}}, 2, None),  # the device could not be opened
        ({"smart_status": {"passed": "yes"}}, 0, None),
        ("not json", 0, None),
    ],
)
def test_smart_is_a_verdict_smartctl_gave_or_none(
    tmp_path: Path, output: dict[str, Any] | str, status: int, expected: bool | None
) -> None:
    block = Disk(name="loop", path=Path("/dev/null"))  # not a block device: smartctl is never asked
    assert smart_health(block, fake_smartctl(tmp_path, output, status)) == {"supported": False, "passed": None}

    class Block(Disk):
        @property
        def block(self) -> bool:
            return True

    health = smart_health(Block(name="sdz", path=Path("/dev/sdz")), fake_smartctl(tmp_path, output, status))
    assert health == {"supported": expected is not None, "passed": expected}


def test_disks_of_sys_block_skip_the_pseudo_devices(tmp_path: Path) -> None:
    for name in ("sda", "nvme0n1", "loop0", "ram0", "zram0", "dm-0", "md127", "sr0"):
        (tmp_path / "block" / name).mkdir(parents=True)
    assert [(d.name, str(d.path)) for d in discover_disks(tmp_path, Path("/dev"))] == [
        ("nvme0n1", "/dev/nvme0n1"),
        ("sda", "/dev/sda"),
    ]


def test_a_declared_disk_is_a_file_or_a_block_device(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot be read"):
        declared_disks([tmp_path / "missing"])
    with pytest.raises(ValueError, match="neither"):
        declared_disks([tmp_path])
    disk = disk_file(tmp_path, 10)
    assert declared_disks([disk, str(disk)]) == [Disk(name=str(disk), path=disk)]


# --- wipe -----------------------------------------------------------------------------------------------------------


def test_a_small_file_is_zeroed_whole(tmp_path: Path) -> None:
    disk = disk_file(tmp_path, 3 * MIB + 17)
    box = machine(tmp_path, disk)
    box.diagnose()
    ran = box.run({"task_id": "t2", "kind": "wipe", "params": {"disks": [str(disk)]}})
    assert ran == Outcome(ok=True, result={"disks": [{"name": str(disk), "method": "zero-full", "ok": True}]})
    assert disk.read_bytes() == bytes(3 * MIB + 17)


def test_a_large_file_is_zeroed_at_its_first_and_last_mib(tmp_path: Path) -> None:
    disk = tmp_path / "big.img"
    size = 65 * MIB + 5
    with disk.open("wb") as file:  # sparse, marked at both ends and in the middle
        file.write(b"\xaa" * (2 * MIB))
        file.seek(size // 2)
        file.write(b"middle")
        file.seek(size - 2 * MIB)
        file.write(b"\xbb" * (2 * MIB))
    outcome = wipe(Disk(name="big", path=disk), blkdiscard="/bin/false")
    assert (outcome.method, outcome.ok) == ("zero-head-tail", True)  # a file is never discarded
    with disk.open("rb") as file:
        head = file.read(MIB)
        assert head == bytes(MIB) and file.read(1) == b"\xaa"
        file.seek(size // 2)
        assert file.read(6) == b"middle"
        file.seek(size - MIB - 1)
        assert file.read(1) == b"\xbb" and file.read() == bytes(MIB)
    assert disk.stat().st_size == size


def test_wipe_refuses_a_disk_diagnose_did_not_report_and_touches_none(tmp_path: Path) -> None:
    reported, other = disk_file(tmp_path, 1000), disk_file(tmp_path, 1000, name="other.img")
    box = machine(tmp_path, reported)
    task = {"task_id": "t3", "kind": "wipe", "params": {"disks": [str(reported), str(other)]}}
    before_diagnose = box.run(task)
    assert (before_diagnose.ok, before_diagnose.error) == (False, "unknown_disk")
    box.diagnose()
    ran = box.run(task)
    assert ran == Outcome(
        ok=False,
        result={
            "disks": [
                {"name": str(reported), "method": "none", "ok": False},
                {"name": str(other), "method": "refused", "ok": False},
            ]
        },
        error="unknown_disk",
    )
    assert reported.read_bytes() == b"\xaa" * 1000 and other.read_bytes() == b"\xaa" * 1000


@pytest.mark.parametrize(
    "task",
    [
        {"task_id": "t", "kind": "wipe", "params": {"disks": "sda"}},
        {"task_id": "t", "kind": "wipe", "params": {"disks": [1]}},
        {"task_id": "t", "kind": "wipe", "params": None},
        {"task_id": "t", "kind": "deploy", "params": {"disk": "x", "image": {"url": "http://h/i", "sha256": "ab"}}},
        {"task_id": "t", "kind": "deploy", "params": {"disk": "x", "image": {"url": 1, "sha256": "ab" * 32}}},
        {
            "task_id": "t",
            "kind": "deploy",
            "params": {"disk": "x", "image": {"url": "http://h/i", "sha256": "ab" * 32, "size": True}},
        },
        {
            "task_id": "t",
            "kind": "deploy",
            "params": {"disk": "x", "image": {"url": "http://h/i", "sha256": "ab" * 32}, "cloud_init": {"x": 1}},
        },
    ],
)
def test_tasks_with_unreadable_params(tmp_path: Path, task: dict[str, Any]) -> None:
    assert machine(tmp_path).run(task).error == "invalid_params"


def test_an_unknown_kind_fails() -> None:
    box = Machine(Inventory(claims={"hostname": "m"}, sections={}, health={}, fake=True), disks=[])
    assert box.run({"task_id": "t", "kind": "firmware", "params": {}}) == Outcome(
        ok=False, result={}, error="unknown_kind"
    )


# --- deploy ---------------------------------------------------------------------------------------------------------

IMAGE = os.urandom(2 * MIB + 123)
DIGEST = hashlib.sha256(IMAGE).hexdigest()


def deploy(disk: Path, url: str, sha256: str = DIGEST, size: int | None = len(IMAGE)) -> dict[str, Any]:
    return {
        "task_id": "t4",
        "kind": "deploy",
        "params": {
            "disk": str(disk),
            "image": {"url": url, "sha256": sha256, "size": size},
            "cloud_init": {"user_data": "#cloud-config\nhostname: m1\n", "meta_data": "instance-id: m1\n"},
        },
    }


def test_deploy_writes_the_image_and_the_cloud_init_seed(tmp_path: Path) -> None:
    disk = disk_file(tmp_path, 4 * MIB)
    box = machine(tmp_path, disk)
    box.diagnose()
    with serve({"/image.raw": IMAGE}) as base:
        ran = box.run(deploy(disk, f"{base}/image.raw", sha256=DIGEST.upper()))
    assert ran == Outcome(ok=True, result={"disk": str(disk), "written_bytes": len(IMAGE), "sha256": DIGEST})
    written = disk.read_bytes()
    assert written[: len(IMAGE)] == IMAGE and written[len(IMAGE) :] == b"\xaa" * (4 * MIB - len(IMAGE))
    seed = tmp_path / "cidata"
    assert (seed / "user-data").read_text() == "#cloud-config\nhostname: m1\n"
    assert (seed / "meta-data").read_text() == "instance-id: m1\n"
    assert stat.S_IMODE((seed / "user-data").stat().st_mode) == 0o600
    assert stat.S_IMODE(seed.stat().st_mode) == 0o700


def test_deploy_with_a_wrong_checksum_is_not_left_bootable(tmp_path: Path) -> None:
    disk = disk_file(tmp_path, 4 * MIB)
    box = machine(tmp_path, disk, cloud_init_dir=tmp_path / "seed")
    box.diagnose()
    with serve({"/image.raw": IMAGE}) as base:
        ran = box.run(deploy(disk, f"{base}/image.raw", sha256="0" * 64))
    assert ran == Outcome(
        ok=False, result={"disk": str(disk), "written_bytes": len(IMAGE), "sha256": DIGEST}, error="checksum_mismatch"
    )
    assert disk.read_bytes()[:MIB] == bytes(MIB)
    assert not (tmp_path / "seed").exists()


@pytest.mark.parametrize(
    ("path", "size", "error"),
    [
        ("/image.raw", len(IMAGE) + 1, "size_mismatch"),
        ("/image.raw", len(IMAGE) - 1, "size_mismatch"),
        ("/missing.raw", None, "download_failed"),
    ],
)
def test_deploy_failures(tmp_path: Path, path: str, size: int | None, error: str) -> None:
    disk = disk_file(tmp_path, 4 * MIB)
    box = machine(tmp_path, disk)
    box.diagnose()
    with serve({"/image.raw": IMAGE}) as base:
        ran = box.run(deploy(disk, base + path, size=size))
    assert (ran.ok, ran.error) == (False, error)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://h/i", "http:///nohost", "not a url"])
def test_deploy_fetches_only_http_and_https(tmp_path: Path, url: str) -> None:
    disk = disk_file(tmp_path, 1000)
    box = machine(tmp_path, disk)
    box.diagnose()
    ran = box.run(deploy(disk, url))
    assert (ran.ok, ran.error, ran.result["written_bytes"]) == (False, "invalid_params", 0)
    assert disk.read_bytes() == b"\xaa" * 1000


def test_deploy_refuses_a_disk_diagnose_did_not_report(tmp_path: Path) -> None:
    disk = disk_file(tmp_path, 1000)
    box = machine(tmp_path, disk)
    ran = box.run(deploy(disk, "http://127.0.0.1:9/image.raw"))
    assert (ran.ok, ran.error) == (False, "unknown_disk")


# --- the command ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["ramdisk", "--help"], ["site", "join", "--help"], ["site", "--help"]])
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 0
    assert "usage: bcd" in capsys.readouterr().out


def test_bcd_ramdisk_without_its_settings_says_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cmdline = tmp_path / "cmdline"
    cmdline.write_text("quiet bc.gateway=gw.example.com:7443\n")
    assert main(["ramdisk", "--cmdline-file", str(cmdline)]) == 1
    error = capsys.readouterr().err
    assert "token: missing" in error and "ca_pin: missing" in error and "gateway" not in error.split("problems")[1]


def test_bcd_site_join_checks_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["site", "join", "--token", "bcjt_x.y", "--gateway", "gw:1", "--ca-pin", PIN]) == 1
    assert "not a site token" in capsys.readouterr().err
    assert main(["site", "join", "--token", "bcst_x.y", "--gateway", "gw", "--ca-pin", "sha256:1"]) == 1
    error = capsys.readouterr().err
    assert "--gateway: must be host:port" in error and "--ca-pin: a CA pin is" in error
