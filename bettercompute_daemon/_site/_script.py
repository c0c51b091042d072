"""The iPXE scripts the site serves.

``/boot.ipxe`` is the same for everyone: it asks for the machine's own script by the MAC of the NIC iPXE booted
from (``netX``, written with hyphens so that it needs no escaping in a URL) and its SMBIOS UUID. The machine's script
boots its kernel and initrd from the site's ``/files/<sha256>``; a machine the plan does not know, or one that
should boot from its disks, gets a script that names no file at all and hands the machine back to its firmware.
"""

from __future__ import annotations

from ._plan import BootEntry

__all__ = ["chain_script", "machine_script"]


def chain_script(base_url: str) -> str:
    """The first script: fetch this machine's own."""
    return f"#!ipxe\nchain {base_url}/script?mac=${{netX/mac:hexhyp}}&uuid=${{uuid}} || exit\n"


def machine_script(entry: BootEntry | None, base_url: str) -> str:
    """The script of ``entry``'s machine (``None``: a machine the plan does not know)."""
    if entry is None:
        return "#!ipxe\necho Better Compute: no boot entry for this machine\nexit\n"
    if entry.action != "ramdisk" or entry.kernel is None:
        return "#!ipxe\necho Better Compute: booting from the local disks\nexit\n"
    kernel = f"kernel {base_url}/files/{entry.kernel.sha256}"
    lines = ["#!ipxe"]
    if entry.initrd is not None:
        kernel += " initrd=initrd"
    if entry.cmdline:
        kernel += f" {entry.cmdline}"
    lines.append(kernel)
    if entry.initrd is not None:
        lines.append(f"initrd --name initrd {base_url}/files/{entry.initrd.sha256}")
    lines.append("boot")
    return "\n".join(lines) + "\n"
