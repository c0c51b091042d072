"""The cloud-init NoCloud seed of an instance: ``meta-data``, ``user-data`` and ``network-config`` on an ISO9660
volume labelled ``cidata`` (with Rock Ridge and Joliet names, so the guest sees the files under their real names).

The YAML is written by hand: every value is emitted as a JSON string, which is a valid YAML double-quoted scalar,
so no key, hostname or user text can break out of its place.

User data: empty user data becomes a ``#cloud-config`` with the instance's SSH keys; a ``#cloud-config`` of the user
becomes a MIME multi-part of that document and one carrying the keys, which cloud-init merges (lists appended), so the
user's own keys are kept; anything else (a script, a multi-part of its own) is passed as written. The keys are also
in ``meta-data`` (``public-keys``), which NoCloud reads whatever the user data is.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from pathlib import Path

import pycdlib

__all__ = ["SeedFiles", "build_seed_iso", "meta_data", "network_config", "seed_files", "user_data"]

SeedFiles = dict[str, bytes]

_MERGE = "list(append)+dict(recurse_array)+str()"


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=True)


def meta_data(instance_id: str, hostname: str, keys: Sequence[str]) -> str:
    """The NoCloud meta-data: instance id, hostname and public keys."""
    lines = [f"instance-id: {_q(instance_id)}", f"local-hostname: {_q(hostname)}"]
    if keys:
        lines.append("public-keys:")
        lines += [f"  - {_q(key)}" for key in keys]
    return "\n".join(lines) + "\n"


def user_data(text: str, hostname: str, keys: Sequence[str]) -> str:
    """The user data to seed (see the module docstring)."""
    ours = ["#cloud-config", f"hostname: {_q(hostname)}"]
    if keys:
        ours.append("ssh_authorized_keys:")
        ours += [f"  - {_q(key)}" for key in keys]
    if not text.strip():
        return "\n".join(ours) + "\n"
    if not text.startswith("#cloud-config"):
        return text
    ours.append(f"merge_how: {_q(_MERGE)}")
    message = MIMEMultipart(boundary="==bettercompute-seed==")
    for name, body in (("user.cfg", text), ("keys.cfg", "\n".join(ours) + "\n")):
        part = MIMEText(body, "cloud-config", "utf-8")
        part.add_header("Content-Disposition", "attachment", filename=name)
        message.attach(part)
    return message.as_string() + "\n"


def network_config(mac: str, address: str, prefix: int, gateway: str) -> str:
    """Network config v2: the NIC with ``mac`` gets a static address and a default route through ``gateway``."""
    return "\n".join(
        [
            "version: 2",
            "ethernets:",
            "  eth0:",
            "    match:",
            f"      macaddress: {_q(mac)}",
            f"    set-name: {_q('eth0')}",
            f"    addresses: [{_q(f'{address}/{prefix}')}]",
            "    routes:",
            f"      - to: {_q('default')}",
            f"        via: {_q(gateway)}",
            "",
        ]
    )


def seed_files(
    *,
    instance_id: str,
    hostname: str,
    keys: Sequence[str],
    text: str,
    mac: str,
    address: str,
    prefix: int,
    gateway: str,
) -> SeedFiles:
    """The three files of the seed."""
    return {
        "meta-data": meta_data(instance_id, hostname, keys).encode(),
        "user-data": user_data(text, hostname, keys).encode(),
        "network-config": network_config(mac, address, prefix, gateway).encode(),
    }


def build_seed_iso(files: SeedFiles, target: Path) -> None:
    """Write ``files`` as an ISO9660 volume labelled ``cidata`` to ``target`` (atomically: a temporary file renamed).

    Raises:
        OSError: it could not be written.
    """
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident="cidata")
    try:
        for index, (name, data) in enumerate(sorted(files.items())):
            iso.add_fp(
                io.BytesIO(data),
                len(data),
                iso_path=f"/FILE{index}.;1",
                rr_name=name,
                joliet_path=f"/{name}",
            )
        temporary = target.with_name(f".{target.name}.tmp")
        with temporary.open("wb") as out:
            iso.write_fp(out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    finally:
        iso.close()
