"""``QemuRuntime``: each instance a QEMU process (TCG unless KVM is allowed and works), controlled over QMP.

An instance's files are in ``<vm_dir>/instances/<id>/``: ``disk.qcow2`` (a copy-on-write overlay on the cached
image), ``seed.iso`` (its NoCloud seed), ``console.log`` (its serial console), ``qemu.log`` (QEMU's own errors),
``qemu.pid`` and ``applied.json`` (what the running VM was started with). QMP sockets are in ``<vm_dir>/run/``
(a unix socket's path is limited to 107 bytes). QEMU runs daemonized, so a restarted ``bcd node`` finds its VMs still
running and adopts them by their pidfile and QMP socket instead of starting them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from .._images import CacheError, ChecksumMismatch, FileCache, FileRefused
from ._network import Addresses, NetworkError, bridge_name, ensure_bridge, ensure_tap, mac_of, remove_tap, tap_name
from ._qmp import QmpError, qmp
from ._runtime import InstanceState, InstanceStatus
from ._seed import build_seed_iso, seed_files
from ._spec import ImageFile, InstanceSpec

__all__ = ["DEFAULT_SUBNET", "QemuOptions", "QemuRuntime"]

log = logging.getLogger("bcd.vm")

DEFAULT_SUBNET = ipaddress.IPv4Network("10.213.0.0/24")

_CONSOLE_KEEP = 1024 * 1024
"""A console log larger than this when its VM starts is cut to its last half (it is appended to otherwise)."""


class _Failed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@attrs.frozen(kw_only=True)
class QemuOptions:
    """How ``QemuRuntime`` runs VMs.

    Attributes:
        vm_dir: Where instances' files are kept.
        cache_dir: The image cache (default ``<vm_dir>/images``).
        image_dirs: The only directories ``file://`` image URLs may name (none: no local file).
        subnet: The node's VM network (a /24 or smaller), its first address the gateway.
        network: ``bridge`` (a tap per instance on the node's bridge; root) or ``user`` (QEMU's user networking).
        bridge: The bridge's name (see ``bridge_name``).
        accel: ``tcg``, or ``kvm`` to use KVM when ``/dev/kvm`` opens (else TCG).
        qemu: The QEMU binary; ``qemu_img`` the disk tool.
        stop_timeout: Seconds a guest has to power down before QEMU is told to quit.
    """

    vm_dir: Path
    cache_dir: Path | None = None
    image_dirs: tuple[Path, ...] = ()
    subnet: ipaddress.IPv4Network = DEFAULT_SUBNET
    network: Literal["bridge", "user"] = "bridge"
    bridge: str = "bcbr-default"
    accel: Literal["tcg", "kvm"] = "tcg"
    qemu: str = "qemu-system-x86_64"
    qemu_img: str = "qemu-img"
    stop_timeout: float = 20.0

    @classmethod
    def for_node(cls, node_id: str, vm_dir: Path, **kwargs: object) -> QemuOptions:
        """Options with the node's bridge name."""
        return cls(vm_dir=vm_dir, bridge=bridge_name(node_id), **kwargs)  # type: ignore[arg-type]  # attrs kwargs


class QemuRuntime:
    """A ``VmRuntime`` on QEMU (see the module docstring)."""

    def __init__(self, options: QemuOptions, *, cache: FileCache | None = None) -> None:
        self.options = options
        self._root = options.vm_dir / "instances"
        self._run = options.vm_dir / "run"
        # Consoles, seeds (user data) and QMP sockets are the tenants' and the node's: nobody else's to read.
        options.vm_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(options.vm_dir, 0o700)
        for folder in (self._root, self._run):
            folder.mkdir(mode=0o700, exist_ok=True)
        self.cache = cache or FileCache(options.cache_dir or options.vm_dir / "images", file_dirs=options.image_dirs)
        self.addresses = Addresses(options.vm_dir / "addresses.json", options.subnet)
        self._statuses: dict[str, InstanceStatus] = {}
        self._wanted_running: set[str] = set()
        self._gpu_warned: set[str] = set()
        for instance_id in self.known():  # adopt what a previous daemon left running
            if self._pid(instance_id) is not None:
                applied = self._applied(instance_id)
                log.info("instance %s: adopted its running VM", instance_id)
                self._wanted_running.add(instance_id)
                self._set(instance_id, int(applied.get("spec", 0)), "running")

    # -- what the protocol asks ---------------------------------------------------------------------------------------

    def known(self) -> list[str]:
        return sorted(p.name for p in self._root.iterdir() if p.is_dir())

    def status(self, instance_id: str) -> InstanceStatus | None:
        return self._statuses.get(instance_id)

    def console_tail(self, instance_id: str, max_bytes: int = 16384) -> str:
        path = self._dir(instance_id) / "console.log"
        try:
            with path.open("rb") as file:
                size = file.seek(0, os.SEEK_END)
                file.seek(max(0, size - max_bytes))
                return file.read(max_bytes).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def address_of(self, instance_id: str) -> str | None:
        return self.addresses.get(instance_id)

    def endpoint(self, instance_id: str, port: int) -> tuple[str, int] | None:
        address = self.addresses.get(instance_id)
        if address is None:
            return None
        if self.options.network == "bridge":
            return address, port
        host_port = self._applied(instance_id).get("forwards", {}).get(str(port))
        return ("127.0.0.1", int(host_port)) if host_port else None

    async def vm_status(self, instance_id: str) -> str | None:
        """QEMU's own word on the VM (QMP ``query-status``: ``running``, ``paused``, ``shutdown``, ...); ``None``
        when no QEMU of the instance answers."""
        if self._pid(instance_id) is None:
            return None
        try:
            answer = await qmp(self._qmp_path(instance_id), "query-status")
        except QmpError:
            return None
        return str(answer.get("status")) if isinstance(answer, dict) else None

    async def apply(self, spec: InstanceSpec) -> InstanceStatus:
        folder = self._dir(spec.id)
        folder.mkdir(parents=True, exist_ok=True)
        if spec.gpus and spec.id not in self._gpu_warned:
            self._gpu_warned.add(spec.id)
            log.warning(
                "instance %s asks for GPUs %s: recorded, but VFIO passthrough is not done by this runtime",
                spec.id,
                ", ".join(spec.gpus),
            )
        if spec.power == "stopped":
            self._wanted_running.discard(spec.id)
            if self._pid(spec.id) is not None:
                return await self._stop(spec.id, spec.spec)
            return self._set(spec.id, spec.spec, "stopped")
        running = self._pid(spec.id) is not None
        applied = self._applied(spec.id)
        if running and applied.get("hardware") == self._hardware(spec) and applied.get("boot", 0) >= spec.boot:
            self._wanted_running.add(spec.id)
            self._save_applied(spec.id, {**applied, "spec": spec.spec})
            return self._set(spec.id, spec.spec, "running")
        try:
            if running:
                log.info("instance %s: restarting (boot %d, or its hardware changed)", spec.id, spec.boot)
                await self._halt(spec.id)
            self._set(spec.id, spec.spec, "provisioning", message="fetching the image")
            files = await self._fetch(spec)
            await self._check_image(spec, files["disk"])
            self._set(spec.id, spec.spec, "provisioning", message="making the disk and seed")
            await self._disk(spec, files["disk"])
            address = self._seed(spec)
            self._set(spec.id, spec.spec, "provisioning", message="starting the VM")
            forwards = await self._start(spec, files, address)
        except _Failed as failed:
            log.error("instance %s failed: %s: %s", spec.id, failed.reason, failed.message)
            self._wanted_running.discard(spec.id)
            return self._set(spec.id, spec.spec, "failed", reason=failed.reason, message=failed.message)
        self._save_applied(
            spec.id, {"spec": spec.spec, "boot": spec.boot, "hardware": self._hardware(spec), "forwards": forwards}
        )
        self._wanted_running.add(spec.id)
        return self._set(spec.id, spec.spec, "running")

    async def stop(self, instance_id: str) -> InstanceStatus:
        self._wanted_running.discard(instance_id)
        known = self._statuses.get(instance_id)
        return await self._stop(instance_id, known.spec if known else 0)

    async def destroy(self, instance_id: str) -> None:
        self._wanted_running.discard(instance_id)
        await self._halt(instance_id)
        if self.options.network == "bridge":
            await asyncio.to_thread(remove_tap, tap_name(instance_id))
        shutil.rmtree(self._dir(instance_id), ignore_errors=True)
        self._qmp_path(instance_id).unlink(missing_ok=True)
        self.addresses.release(instance_id)
        self._statuses.pop(instance_id, None)
        log.info("instance %s: deleted", instance_id)

    def poll(self) -> list[str]:
        changed = []
        for instance_id in list(self._wanted_running):
            if self._pid(instance_id) is not None:
                continue
            self._wanted_running.discard(instance_id)
            self._pidfile(instance_id).unlink(missing_ok=True)
            tail = self._qemu_log_tail(instance_id)
            known = self._statuses.get(instance_id)
            message = "the VM exited unexpectedly" + (f": {tail}" if tail else "")
            log.error("instance %s: %s", instance_id, message)
            self._set(instance_id, known.spec if known else 0, "failed", reason="VM_CRASHED", message=message)
            changed.append(instance_id)
        return changed

    # -- the steps ----------------------------------------------------------------------------------------------------

    async def _fetch(self, spec: InstanceSpec) -> dict[str, Path]:
        wanted: dict[str, ImageFile] = {"disk": spec.image.disk}
        if spec.image.kernel is not None:
            wanted["kernel"] = spec.image.kernel
        if spec.image.initrd is not None:
            wanted["initrd"] = spec.image.initrd
        paths = {}
        for name, file in wanted.items():
            try:
                paths[name] = await self.cache.ensure(file)
            except FileRefused as exc:
                raise _Failed("IMAGE_REFUSED", f"image {name}: {exc}") from None
            except ChecksumMismatch as exc:
                raise _Failed("IMAGE_CHECKSUM_MISMATCH", f"image {name}: {exc}") from None
            except CacheError as exc:
                raise _Failed("IMAGE_FETCH_FAILED", f"image {name}: {exc}") from None
        return paths

    async def _check_image(self, spec: InstanceSpec, base: Path) -> None:
        """Refuse a disk image that would make QEMU open another file of the node.

        A qcow2 image may name a backing file or an external ``data-file``: any path on the node (a key, a block
        device, another instance's disk), which QEMU (root in bridge mode) would open and show to the guest. A file
        declared ``raw`` that is really qcow2 (or any other format) is refused as well, so that nothing ever probes
        it into one. ``qemu-img info`` opens the image alone (it never follows a backing chain); ``-U`` so that an
        image in use by a running VM can be read.

        Raises:
            _Failed: IMAGE_REFUSED; its message names the image by its id, never by a path of the node.
        """
        declared = spec.image.format
        name = f"image {spec.image.id or 'disk'}"
        info = await self._image_info(base, declared, name)
        if declared == "raw":
            probed = (await self._image_info(base, None, name)).get("format")
            if probed != "raw":
                raise _Failed("IMAGE_REFUSED", f"{name} is declared raw but is {probed}: refused")
        if info.get("backing-filename") or info.get("full-backing-filename") or info.get("backing-filename-format"):
            raise _Failed("IMAGE_REFUSED", f"{name} names a backing file: refused")
        data = (info.get("format-specific") or {}).get("data") or {}
        if data.get("data-file") or data.get("data-file-raw"):
            raise _Failed("IMAGE_REFUSED", f"{name} names an external data file: refused")

    async def _image_info(self, path: Path, declared: str | None, name: str) -> dict[str, Any]:
        """``qemu-img info`` of one file, as ``declared`` (or probed when ``None``)."""
        fmt = ["-f", declared] if declared else []
        try:
            out = await self._tool(self.options.qemu_img, "info", "-U", "--output=json", *fmt, str(path))
            info = json.loads(out)
        except (_Failed, ValueError):
            what = f"a {declared} image" if declared else "a disk image"
            raise _Failed("IMAGE_REFUSED", f"{name} cannot be read as {what}: refused") from None
        if not isinstance(info, dict):
            raise _Failed("IMAGE_REFUSED", f"{name}: qemu-img info gave no answer: refused")
        return info

    async def _disk(self, spec: InstanceSpec, base: Path) -> None:
        disk = self._dir(spec.id) / "disk.qcow2"
        size = spec.disk_gib * 1024**3
        if not disk.exists():
            temporary = disk.with_name(".disk.qcow2.tmp")
            temporary.unlink(missing_ok=True)
            backing = ["-b", str(base), "-F", spec.image.format]
            await self._tool(self.options.qemu_img, "create", "-q", "-f", "qcow2", *backing, str(temporary), str(size))
            os.replace(temporary, disk)
            return
        info = json.loads(
            await self._tool(self.options.qemu_img, "info", "-U", "--output=json", "-f", "qcow2", str(disk))
        )
        current = int(info.get("virtual-size", 0))
        if size > current:
            log.info("instance %s: growing its disk to %d GiB", spec.id, spec.disk_gib)
            await self._tool(self.options.qemu_img, "resize", "-q", "-f", "qcow2", str(disk), str(size))
        elif size < current:
            log.warning("instance %s: a disk is never shrunk; it stays at %d bytes", spec.id, current)

    def _seed(self, spec: InstanceSpec) -> str:
        try:
            address = self.addresses.assign(spec.id)
        except NetworkError as exc:
            raise _Failed("NETWORK_FAILED", str(exc)) from None
        files = seed_files(
            instance_id=spec.id,
            hostname=spec.hostname,
            keys=spec.ssh_authorized_keys,
            text=spec.user_data,
            mac=mac_of(spec.id),
            address=address,
            prefix=self.options.subnet.prefixlen,
            gateway=self.addresses.gateway,
        )
        try:
            build_seed_iso(files, self._dir(spec.id) / "seed.iso")
        except OSError as exc:
            raise _Failed("SEED_FAILED", f"the seed could not be written: {exc}") from None
        return address

    async def _start(self, spec: InstanceSpec, files: dict[str, Path], address: str) -> dict[str, int]:
        """Start the VM; the forwarded host ports by guest port (user networking)."""
        folder = self._dir(spec.id)
        options = self.options
        forwards: dict[int, int] = {}
        if options.network == "bridge":
            try:
                await asyncio.to_thread(ensure_bridge, options.bridge, self.addresses.gateway, options.subnet.prefixlen)
                await asyncio.to_thread(ensure_tap, tap_name(spec.id), options.bridge)
            except NetworkError as exc:
                raise _Failed("NETWORK_FAILED", str(exc)) from None
            netdev = f"tap,id=net0,ifname={tap_name(spec.id)},script=no,downscript=no"
        else:
            forwards = self.addresses.forwards(spec.id, spec.ports)
            rules = "".join(f",hostfwd=tcp:127.0.0.1:{h}-{address}:{g}" for g, h in sorted(forwards.items()))
            netdev = f"user,id=net0,net={options.subnet},host={self.addresses.gateway}{rules}"
        console = folder / "console.log"
        if console.exists() and console.stat().st_size > _CONSOLE_KEEP:
            kept = self.console_tail(spec.id, _CONSOLE_KEEP // 2)
            console.write_text(kept)
        qmp_path = self._qmp_path(spec.id)
        qmp_path.unlink(missing_ok=True)
        self._pidfile(spec.id).unlink(missing_ok=True)
        command = [
            options.qemu,
            "-name",
            f"bc-{spec.id}",
            "-machine",
            "q35",
            "-accel",
            self._accel(),
            "-smp",
            str(spec.vcpu),
            "-m",
            str(spec.memory_mib),
            "-nodefaults",
            # seccomp: no obsolete system calls, no scheduler or affinity changes. elevateprivileges=deny and
            # spawn=deny would be wanted too, but the filter is in place before -daemonize forks and calls setsid,
            # which they forbid (QEMU 7.2 then fails to start). QEMU still runs as the daemon's user (root in
            # bridge mode).
            "-sandbox",
            "on,obsolete=deny,resourcecontrol=deny",
            "-display",
            "none",
            "-chardev",
            f"file,id=console,path={console},append=on",
            "-serial",
            "chardev:console",
            # Both formats named, the overlay's and its backing image's, so that QEMU probes neither.
            "-drive",
            f"file={folder / 'disk.qcow2'},if=virtio,format=qcow2,backing.driver={spec.image.format}",
            "-drive",
            f"file={folder / 'seed.iso'},if=virtio,format=raw,readonly=on",
            "-netdev",
            netdev,
            "-device",
            f"virtio-net-pci,netdev=net0,mac={mac_of(spec.id)}",
            "-qmp",
            f"unix:{qmp_path},server=on,wait=off",
            "-pidfile",
            str(self._pidfile(spec.id)),
            "-daemonize",
        ]
        if "kernel" in files:
            command += ["-kernel", str(files["kernel"])]
            command += ["-append", spec.image.cmdline or "console=ttyS0 root=/dev/vda rw"]
        if "initrd" in files:
            command += ["-initrd", str(files["initrd"])]
        try:
            await self._tool(*command, log_to=folder / "qemu.log")
        except _Failed as failed:
            raise _Failed("VM_START_FAILED", failed.message) from None
        if self._pid(spec.id) is None:
            raise _Failed("VM_START_FAILED", "QEMU exited at once: " + self._qemu_log_tail(spec.id))
        log.info("instance %s: VM started (%s)", spec.id, address)
        return {str(k): v for k, v in forwards.items()}

    async def _stop(self, instance_id: str, spec: int) -> InstanceStatus:
        try:
            await self._halt(instance_id)
        except _Failed as failed:
            return self._set(instance_id, spec, "failed", reason=failed.reason, message=failed.message)
        return self._set(instance_id, spec, "stopped")

    async def _halt(self, instance_id: str) -> None:
        """Power the VM down: ACPI first, then QMP ``quit``, then SIGKILL."""
        self._wanted_running.discard(instance_id)
        pid = self._pid(instance_id)
        if pid is None:
            return
        socket_path = self._qmp_path(instance_id)
        with contextlib.suppress(QmpError):
            await qmp(socket_path, "system_powerdown")
        if not await self._exited(pid, self.options.stop_timeout):
            log.info("instance %s: did not power down within %.0f s; quitting", instance_id, self.options.stop_timeout)
            with contextlib.suppress(QmpError):
                await qmp(socket_path, "quit")
            if not await self._exited(pid, 5.0):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                if not await self._exited(pid, 5.0):
                    raise _Failed("VM_STOP_FAILED", f"QEMU (pid {pid}) does not exit")
        self._pidfile(instance_id).unlink(missing_ok=True)
        log.info("instance %s: VM stopped", instance_id)

    async def _exited(self, pid: int, within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if not _alive(pid):
                return True
            await asyncio.sleep(0.1)
        return not _alive(pid)

    # -- helpers ------------------------------------------------------------------------------------------------------

    def _accel(self) -> str:
        if self.options.accel == "kvm":
            try:
                os.close(os.open("/dev/kvm", os.O_RDWR))
                return "kvm"
            except OSError:
                log.warning("KVM is allowed but /dev/kvm does not open: using TCG")
        return "tcg"

    async def _tool(self, *command: str, log_to: Path | None = None) -> str:
        """Run a command to its end; its output.

        Raises:
            _Failed: DISK_FAILED (the caller renames it) when it fails or does not start.
        """
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            async with asyncio.timeout(120):
                out, err = await process.communicate()
        except (OSError, TimeoutError) as exc:
            raise _Failed("DISK_FAILED", f"{Path(command[0]).name}: {exc}") from None
        if log_to is not None:
            await asyncio.to_thread(log_to.write_bytes, err)
        if process.returncode != 0:
            text = err.decode(errors="replace").strip().splitlines()
            raise _Failed("DISK_FAILED", f"{Path(command[0]).name}: {' '.join(text[-3:]) or process.returncode}")
        return out.decode(errors="replace")

    def _hardware(self, spec: InstanceSpec) -> list[object]:
        """What the VM was started with, as JSON (compared with what ``applied.json`` kept): what cannot change
        without a restart, the forwarded ports too with user networking."""
        ports = list(spec.ports) if self.options.network == "user" else []
        return [*_hardware(spec), ports]

    def _dir(self, instance_id: str) -> Path:
        return self._root / instance_id

    def _pidfile(self, instance_id: str) -> Path:
        return self._dir(instance_id) / "qemu.pid"

    def _qmp_path(self, instance_id: str) -> Path:
        return self._run / (hashlib.sha256(instance_id.encode()).hexdigest()[:16] + ".qmp")

    def _pid(self, instance_id: str) -> int | None:
        """The pid of the instance's QEMU when it runs (the pidfile's, checked against the process's command line,
        so that a recycled pid is not taken for the VM)."""
        try:
            pid = int(self._pidfile(instance_id).read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        return pid if str(self._qmp_path(instance_id)).encode() in cmdline else None

    def _applied(self, instance_id: str) -> dict[str, Any]:
        try:
            value = json.loads((self._dir(instance_id) / "applied.json").read_text())
        except (OSError, ValueError):
            return {}
        return value if isinstance(value, dict) else {}

    def _save_applied(self, instance_id: str, applied: dict[str, Any]) -> None:
        path = self._dir(instance_id) / "applied.json"
        temporary = path.with_name(".applied.json.tmp")
        temporary.write_text(json.dumps(applied))
        os.replace(temporary, path)

    def _qemu_log_tail(self, instance_id: str) -> str:
        try:
            text = (self._dir(instance_id) / "qemu.log").read_text(errors="replace")
        except OSError:
            return ""
        return " ".join(text.strip().splitlines()[-3:])[:500]

    def _set(
        self,
        instance_id: str,
        spec: int,
        state: InstanceState,
        *,
        reason: str | None = None,
        message: str = "",
    ) -> InstanceStatus:
        address = self.addresses.get(instance_id)
        status = InstanceStatus(
            id=instance_id,
            spec=spec,
            state=state,
            reason=reason,
            message=message,
            addresses=(address,) if address else (),
        )
        self._statuses[instance_id] = status
        return status


def _hardware(spec: InstanceSpec) -> list[object]:
    image = spec.image
    files: Sequence[ImageFile | None] = (image.disk, image.kernel, image.initrd)
    return [
        spec.vcpu,
        spec.memory_mib,
        spec.disk_gib,
        image.format,
        [f.sha256 if f else None for f in files],
        image.cmdline,
        list(spec.gpus),
    ]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a daemonized QEMU is not our child, but one that is (started without -daemonize) would linger as a zombie
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
