"""``bcd node``'s own settings: without ``vm_dir`` no VMs; every problem of the file listed at once."""

from __future__ import annotations

import ipaddress
import json
import time
from pathlib import Path

import pytest

from bettercompute_daemon._cli import _node_settings, _vm_host
from bettercompute_daemon._config import ConfigError, NodeSettings, node_settings
from bettercompute_daemon._vm import QemuRuntime, bridge_name

from .test_renewal import NODE_ID, joined


def test_no_settings_run_no_vms() -> None:
    assert node_settings({}) == NodeSettings()
    assert NodeSettings().vm_dir is None and NodeSettings().image_dirs == ()


def test_the_settings_are_read() -> None:
    settings = node_settings(
        {
            "vm_dir": "/var/lib/bcd/vm",
            "image_dirs": ["/srv/images"],
            "vm_subnet": "10.50.0.0/24",
            "vm_network": "user",
            "vm_accel": "kvm",
            "vm_stop_timeout": 5,
            "vm_cache_dir": None,
        }
    )
    assert settings.vm_dir == Path("/var/lib/bcd/vm") and settings.image_dirs == (Path("/srv/images"),)
    assert settings.vm_subnet == ipaddress.IPv4Network("10.50.0.0/24")
    assert (settings.vm_network, settings.vm_accel, settings.vm_stop_timeout) == ("user", "kvm", 5.0)


def test_every_problem_is_listed(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text(
        json.dumps(
            {
                "vm_dir": "relative/vm",
                "image_dirs": "/srv",
                "vm_subnet": "10.50.0.0/30",
                "vm_network": "macvtap",
                "vm_accel": "hvf",
                "vm_stop_timeout": True,
                "vm_dri": "/x",
            }
        )
    )
    with pytest.raises(ConfigError) as raised:
        _node_settings(path)
    problems = raised.value.problems
    assert str(raised.value).startswith("the node settings file has 7 problems:")
    assert len(problems) == 7
    assert all(p.startswith(f"{path}: ") for p in problems)
    assert any("vm_dri" in p and "not a node setting" in p for p in problems)


def test_a_node_with_a_vm_dir_gets_a_vm_host_on_its_own_bridge(tmp_path: Path) -> None:
    now = time.time()
    state, _ = joined(tmp_path, not_before=now - 60, not_after=now + 3600)
    assert _vm_host(state, NodeSettings()) is None
    settings = node_settings({"vm_dir": str(tmp_path / "vm"), "vm_network": "user", "image_dirs": ["/srv/images"]})
    host = _vm_host(state, settings)
    assert host is not None and isinstance(host.runtime, QemuRuntime)
    options = host.runtime.options
    assert options.bridge == bridge_name(NODE_ID) and options.network == "user"
    assert options.image_dirs == (Path("/srv/images"),) and options.accel == "tcg"
    assert (tmp_path / "vm").stat().st_mode & 0o777 == 0o700


def test_tunnel_local_ports_are_none_unless_listed() -> None:
    assert NodeSettings().tunnel_local_ports == ()
    assert node_settings({"tunnel_local_ports": [8080, 22, 22]}).tunnel_local_ports == (22, 8080)
    for bad in ([0], [65536], ["22"], [True], 22):
        with pytest.raises(ConfigError) as raised:
            node_settings({"tunnel_local_ports": bad})
        assert any("tunnel_local_ports" in p for p in raised.value.problems)
