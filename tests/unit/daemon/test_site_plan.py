"""``bcd site``'s boot plan: finding a machine by MAC, then by SMBIOS UUID; what a plan refuses; the scripts it
renders."""

from __future__ import annotations

import pytest

from bettercompute_daemon._site._plan import BootEntry, BootFile, BootPlan, BootRecord, normalize_mac
from bettercompute_daemon._site._script import chain_script, machine_script

KERNEL = BootFile(sha256="a" * 64, url="http://images/kernel", size=10)
INITRD = BootFile(sha256="b" * 64, url="http://images/initrd")
BASE = "http://10.0.0.1:8080"


def entry(machine_id: str, macs: list[str], system_uuid: str | None = None, **kwargs: object) -> BootEntry:
    return BootEntry(machine_id=machine_id, macs=macs, system_uuid=system_uuid, **kwargs)  # type: ignore[arg-type]


def test_a_machine_is_found_by_any_spelling_of_its_mac() -> None:
    plan = BootPlan(entries=(entry("m1", ["AA:BB:CC:00:11:22", "aa-bb-cc-00-11-33"]),), generation=3)
    assert plan.entries[0].macs == ("aa:bb:cc:00:11:22", "aa:bb:cc:00:11:33")
    for spelling in ("aa:bb:cc:00:11:22", "AA-BB-CC-00-11-22", "aabbcc001133", " Aa:bB:cc:00:11:33 "):
        found = plan.find(spelling)
        assert found is not None and found.machine_id == "m1"
    assert plan.find("aa:bb:cc:00:11:44") is None
    assert plan.find("not a mac") is None
    assert plan.find(None, None) is None


def test_the_mac_wins_and_the_uuid_is_used_only_when_the_mac_is_unknown() -> None:
    uuid_a, uuid_b = "4C4C4544-0042-3510-8052-B4C04F4B4E31", "00000000-0000-0000-0000-0000000000b2"
    plan = BootPlan(entries=(entry("a", ["02:00:00:00:00:0a"], uuid_a), entry("b", ["02:00:00:00:00:0b"], uuid_b)))
    found = plan.find("02:00:00:00:00:0a", uuid_b)
    assert found is not None and found.machine_id == "a"
    by_uuid = plan.find("02:00:00:00:00:ff", uuid_a.lower())
    assert by_uuid is not None and by_uuid.machine_id == "a"
    assert plan.find("02:00:00:00:00:ff", "not-a-uuid") is None
    assert plan.find(None, "{" + uuid_b.upper() + "}") is not None


def test_a_plan_refuses_shared_macs_uuids_and_machine_ids() -> None:
    with pytest.raises(ValueError, match="belongs to both"):
        BootPlan(entries=(entry("a", ["02:00:00:00:00:01"]), entry("b", ["02-00-00-00-00-01"])))
    same = "00000000-0000-0000-0000-000000000001"
    with pytest.raises(ValueError, match="belongs to both"):
        BootPlan(entries=(entry("a", [], same), entry("b", [], same)))
    with pytest.raises(ValueError, match="twice"):
        BootPlan(entries=(entry("a", []), entry("a", [])))


def test_entries_and_files_are_checked() -> None:
    with pytest.raises(ValueError, match="needs a kernel"):
        entry("a", [], action="ramdisk")
    with pytest.raises(ValueError, match="control character"):
        entry("a", [], action="ramdisk", kernel=KERNEL, cmdline="quiet\nshell")
    with pytest.raises(ValueError):
        entry("a", [], action="reinstall")
    with pytest.raises(ValueError, match="64 lower-case hex"):
        BootFile(sha256="A" * 64, url="http://x")
    with pytest.raises(ValueError):
        normalize_mac("aa:bb:cc:dd:ee")


def test_the_plan_knows_only_the_files_of_ramdisk_entries() -> None:
    plan = BootPlan(
        entries=(
            entry("a", ["02:00:00:00:00:01"], action="ramdisk", kernel=KERNEL, initrd=INITRD),
            entry("b", ["02:00:00:00:00:02"], action="local", kernel=BootFile(sha256="c" * 64, url="http://x")),
        )
    )
    assert plan.file("a" * 64) == KERNEL
    assert plan.file("c" * 64) is None
    assert {f.sha256 for f in plan.files()} == {"a" * 64, "b" * 64}


def test_a_plan_reads_its_json_form() -> None:
    plan = BootPlan.from_json(
        {
            "generation": 7,
            "entries": [
                {
                    "machine_id": "m1",
                    "macs": ["AA:BB:CC:DD:EE:FF"],
                    "system_uuid": None,
                    "action": "ramdisk",
                    "kernel": {"sha256": "a" * 64, "url": "file:///k", "size": 3},
                    "cmdline": "console=ttyS0",
                }
            ],
        }
    )
    assert plan.generation == 7
    found = plan.find("aa:bb:cc:dd:ee:ff")
    assert found is not None and found.kernel is not None and found.kernel.size == 3
    with pytest.raises(ValueError):
        BootPlan.from_json({"generation": "7"})
    with pytest.raises(ValueError):
        BootFile.from_json({"sha256": "a" * 64, "url": "x", "size": -1})
    record = BootRecord(kind="script", mac=None, system_uuid=None, machine_id=None, detail="no entry", at=1.0)
    assert record.to_json()["kind"] == "script"


def test_an_unknown_machine_gets_a_script_that_names_no_file() -> None:
    script = machine_script(None, BASE)
    assert script.startswith("#!ipxe\n") and "exit" in script
    assert "/files/" not in script and "kernel" not in script
    local = machine_script(entry("a", [], action="local"), BASE)
    assert "/files/" not in local and local.rstrip().endswith("exit")


def test_a_ramdisk_script_boots_the_kernel_and_initrd_by_their_hashes() -> None:
    script = machine_script(
        entry("a", [], action="ramdisk", kernel=KERNEL, initrd=INITRD, cmdline="console=ttyS0 quiet"), BASE
    )
    assert script.splitlines() == [
        "#!ipxe",
        f"kernel {BASE}/files/{'a' * 64} initrd=initrd console=ttyS0 quiet",
        f"initrd --name initrd {BASE}/files/{'b' * 64}",
        "boot",
    ]
    bare = machine_script(entry("a", [], action="ramdisk", kernel=KERNEL), BASE)
    assert bare.splitlines() == ["#!ipxe", f"kernel {BASE}/files/{'a' * 64}", "boot"]
    assert "${netX/mac:hexhyp}" in chain_script(BASE) and "${uuid}" in chain_script(BASE)
