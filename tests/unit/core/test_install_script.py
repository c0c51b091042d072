"""The install script ``join-tokens.create`` returns, run for real by ``sh`` (dash: POSIX, no bashisms) in a
temporary root: every value it embeds stays data, whatever it holds, and ``bcd`` is what checks the configuration."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bettercompute.modules.nodes._install import install_script
from tests._timing import deadline

BCD = str(Path(sys.executable).parent / "bcd")
JOIN_KEY = "A" * 43
PIN = "sha256:" + "0" * 64
HOSTILE = [
    "pool'; touch PWNED; echo '",
    'pool"$(touch PWNED)"`touch PWNED`',
    "pool\n touch PWNED\n",
    "pool\\'$HOME${IFS}*",
    "pool\u00e9\u202e\x00",
]


def run(script: str, root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (root / "install.sh").write_text(script)
    environment = {
        "PATH": os.environ["PATH"],
        "HOME": str(root),
        "BCD_ETC": str(root / "etc" / "bcd"),
        "BCD_STATE_DIR": str(root / "var" / "lib" / "bcd"),
        "BCD_SYSTEMD_DIR": str(root / "etc" / "systemd" / "system"),
        "BCD_SKIP_SYSTEMCTL": "1",
        "BCD_BIN": BCD,
        **env,
    }
    return subprocess.run(
        ["/bin/sh", str(root / "install.sh")],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=deadline(60),
        check=False,
    )


@pytest.mark.parametrize("pool", HOSTILE)
def test_hostile_values_stay_data(tmp_path: Path, pool: str) -> None:
    token = "bcjt_'\"$(touch PWNED)`touch PWNED`${IFS}"  # the token too is only ever data
    script = install_script(
        token=token, gateway="127.0.0.1:1", trust_domain=pool, pool_id=pool, join_key=JOIN_KEY, ca_pin=PIN
    )
    assert subprocess.run(["/bin/sh", "-n"], input=script, text=True, check=False).returncode == 0
    done = run(script, tmp_path)
    assert not list(tmp_path.rglob("PWNED"))
    # The configuration holds exactly what was given; bcd then refuses it (the pool and trust domain are malformed).
    config = json.loads((tmp_path / "etc" / "bcd" / "join.json").read_text())
    assert config == {
        "gateway": "127.0.0.1:1",
        "trust_domain": pool,
        "pool": pool,
        "join_key": JOIN_KEY,
        "ca_pin": PIN,
    }
    assert done.returncode == 1
    assert "trust_domain: " in done.stderr and "pool: " in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "var" / "lib" / "bcd").exists()


def test_it_writes_the_config_and_unit_then_runs_bcd_join(tmp_path: Path) -> None:
    script = install_script(
        token="bcjt_jt_00000000000000000000.x", gateway="127.0.0.1:1", trust_domain="example.com",
        pool_id="pool_1", join_key=JOIN_KEY, ca_pin=PIN,
    )  # fmt: skip
    (tmp_path / "inventory.json").write_text(json.dumps({"claims": {"hostname": "h", "serial": "SN-1"}}))
    done = run(script, tmp_path, BCD_FAKE_INVENTORY=str(tmp_path / "inventory.json"))
    config = tmp_path / "etc" / "bcd" / "join.json"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    unit = (tmp_path / "etc" / "systemd" / "system" / "bcd.service").read_text()
    assert f"ExecStart={BCD} --state-dir {tmp_path}/var/lib/bcd --fake-inventory {tmp_path}/inventory.json node" in unit
    assert "RestartPreventExitStatus=3" in unit
    # bcd join ran with that configuration: nothing listens on port 1, and it says so.
    assert done.returncode == 1, done.stderr
    assert "the gateway 127.0.0.1:1 could not be reached" in done.stderr


def test_without_bcd_or_python_it_stops_with_a_reason(tmp_path: Path) -> None:
    script = install_script(
        token="bcjt_x", gateway="127.0.0.1:1", trust_domain="example.com", pool_id=None, join_key=JOIN_KEY, ca_pin=PIN
    )
    (tmp_path / "bin").mkdir()
    done = run(script, tmp_path, BCD_BIN="", PATH=str(tmp_path / "bin"))
    assert done.returncode == 1
    assert "bcd is not installed, and there is no python3 to install it with" in done.stderr
    assert not (tmp_path / "etc").exists()


def test_a_token_that_is_not_printable_ascii_is_refused() -> None:
    for token in ("bcjt_\n", "bcjt_\x00", "bcjt_\u00e9"):
        with pytest.raises(ValueError, match="printable ASCII"):
            install_script(token=token, gateway="g:1", trust_domain="d", pool_id=None, join_key=JOIN_KEY, ca_pin=PIN)
