"""An instance's NoCloud seed: what the guest's cloud-init reads, on a volume labelled ``cidata``, and the specs and
addresses it is made from."""

from __future__ import annotations

import email
import io
import ipaddress
from pathlib import Path

import pycdlib
import pytest
import yaml

from bettercompute_daemon._vm import Addresses, SpecError, build_seed_iso, parse_instance, parse_instances, seed_files
from bettercompute_daemon._vm._network import NetworkError, bridge_name, mac_of, tap_name

KEY = 'ssh-ed25519 AAAAC3Nza "quoted": comment #not-a-comment'


def _files(text: str) -> dict[str, bytes]:
    return seed_files(
        instance_id="inst_1",
        hostname="web-1",
        keys=[KEY],
        text=text,
        mac="52:54:00:aa:bb:cc",
        address="10.213.0.5",
        prefix=24,
        gateway="10.213.0.1",
    )


def test_meta_data_and_network_config_say_what_the_instance_is() -> None:
    files = _files("")
    assert yaml.safe_load(files["meta-data"]) == {
        "instance-id": "inst_1",
        "local-hostname": "web-1",
        "public-keys": [KEY],
    }
    assert yaml.safe_load(files["network-config"]) == {
        "version": 2,
        "ethernets": {
            "eth0": {
                "match": {"macaddress": "52:54:00:aa:bb:cc"},
                "set-name": "eth0",
                "addresses": ["10.213.0.5/24"],
                "routes": [{"to": "default", "via": "10.213.0.1"}],
            }
        },
    }


def test_empty_user_data_becomes_a_cloud_config_with_the_keys() -> None:
    text = _files("")["user-data"].decode()
    assert text.startswith("#cloud-config\n")
    assert yaml.safe_load(text) == {"hostname": "web-1", "ssh_authorized_keys": [KEY]}


def test_a_users_cloud_config_is_kept_and_the_keys_merged_in() -> None:
    mine = "#cloud-config\nssh_authorized_keys: [ssh-rsa MINE]\npackages: [nginx]\n"
    message = email.message_from_string(_files(mine)["user-data"].decode())
    assert message.is_multipart()
    parts = [p for p in message.walk() if p.get_content_type() == "text/cloud-config"]
    documents = [yaml.safe_load(bytes(p.get_payload(decode=True))) for p in parts]
    assert documents[0] == {"ssh_authorized_keys": ["ssh-rsa MINE"], "packages": ["nginx"]}
    assert documents[1]["ssh_authorized_keys"] == [KEY]
    assert "list(append)" in documents[1]["merge_how"]  # cloud-init appends the lists: the user's key stays


def test_other_user_data_is_passed_as_written() -> None:
    script = "#!/bin/sh\necho hi\n"
    assert _files(script)["user-data"].decode() == script


def test_the_seed_is_an_iso9660_volume_labelled_cidata_with_the_real_names(tmp_path: Path) -> None:
    files = _files("")
    target = tmp_path / "seed.iso"
    build_seed_iso(files, target)
    iso = pycdlib.PyCdlib()
    iso.open(str(target))
    try:
        assert iso.pvd.volume_identifier.decode().strip() == "cidata"
        for name, data in files.items():
            out = io.BytesIO()
            iso.get_file_from_iso_fp(out, rr_path=f"/{name}")
            assert out.getvalue() == data
    finally:
        iso.close()


def test_addresses_are_stable_kept_and_handed_out_lowest_first(tmp_path: Path) -> None:
    path = tmp_path / "addresses.json"
    addresses = Addresses(path, ipaddress.IPv4Network("10.213.0.0/24"))
    assert addresses.gateway == "10.213.0.1"
    assert addresses.assign("a") == "10.213.0.2"
    assert addresses.assign("b") == "10.213.0.3"
    assert addresses.assign("a") == "10.213.0.2"
    again = Addresses(path, ipaddress.IPv4Network("10.213.0.0/24"))  # a restarted daemon
    assert again.get("b") == "10.213.0.3"
    again.release("a")
    assert again.assign("c") == "10.213.0.2"
    assert Addresses(path, ipaddress.IPv4Network("10.213.0.0/24")).get("a") is None


def test_a_full_subnet_refuses_another_instance(tmp_path: Path) -> None:
    addresses = Addresses(tmp_path / "a.json", ipaddress.IPv4Network("10.213.0.0/29"))  # 6 hosts, 1 is the gateway
    for index in range(5):
        addresses.assign(f"i{index}")
    with pytest.raises(NetworkError, match="no free address"):
        addresses.assign("one-more")


def test_link_names_fit_linux_and_macs_are_local() -> None:
    assert len(bridge_name("node_" + "x" * 60)) <= 15
    assert len(tap_name("inst_" + "y" * 100)) <= 15
    assert tap_name("inst_a") != tap_name("inst_b")
    assert mac_of("inst_a").startswith("52:54:00:") and mac_of("inst_a") == mac_of("inst_a")


def _entry(**changes: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "id": "inst_1",
        "tenant": "t",
        "spec": 3,
        "power": "running",
        "boot": 0,
        "vcpu": 1,
        "memory_mib": 512,
        "disk_gib": 1,
        "gpus": [],
        "hostname": "web-1",
        "ssh_authorized_keys": [],
        "user_data": "",
        "ports": [22],
        "image": {
            "id": "img_1",
            "url": "https://images.example/d.raw",
            "sha256": "a" * 64,
            "size": 1,
            "format": "raw",
            "kernel": None,
            "initrd": None,
            "cmdline": None,
        },
    }
    entry.update(changes)
    return entry


def test_specs_are_checked_one_instance_at_a_time() -> None:
    assert parse_instances({"allocations": []}) == ([], {})
    specs, invalid = parse_instances({"instances": [_entry(), _entry(id="inst_2", hostname="bad host")]})
    assert [s.id for s in specs] == ["inst_1"]
    assert specs[0].spec == 3 and specs[0].image.format == "raw"
    assert "hostname" in str(invalid["inst_2"])
    with pytest.raises(SpecError, match="twice"):
        parse_instances({"instances": [_entry(), _entry()]})
    for bad in (
        {"power": "paused"},
        {"ssh_authorized_keys": ["ssh-ed25519 A\nrunmd: evil"]},
        {"image": {**_entry()["image"], "url": "ftp://x/y"}},  # type: ignore[dict-item]
        {"image": {**_entry()["image"], "sha256": "nothex"}},  # type: ignore[dict-item]
        {"ports": [0]},
    ):
        with pytest.raises(SpecError):
            parse_instance(_entry(**bad))
