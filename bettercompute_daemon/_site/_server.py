"""``BootServer``: the proxy DHCP, TFTP and HTTP servers of one site LAN, sharing one boot plan.

The chain a machine goes through: its firmware's DHCP gets a proxy offer naming the site's iPXE binary; it fetches
that over TFTP; the site's iPXE asks DHCP again and is sent to ``/boot.ipxe`` (the chain rule in ``_dhcp``), which
fetches ``/script`` with its MAC and UUID; the script boots the machine's kernel and initrd from ``/files/``.

The plan may be replaced at any moment (``set_plan``): each request reads the plan of that moment, and the files of
a new plan are fetched into the cache in the background so that the first machine to boot does not wait for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from ._cache import CacheError, FileCache
from ._dhcp import BIOS_FILE, EFI_FILE, ChainMarks, ProxyDhcp
from ._http import HttpBootServer
from ._plan import BootPlan, BootRecord
from ._tftp import TftpServer

__all__ = ["DEFAULT_BOOT_FILES", "BootServer"]

log = logging.getLogger("bcd.site")

DEFAULT_BOOT_FILES = Path("/usr/lib/ipxe")
"""Where Debian's ``ipxe`` package puts ``undionly.kpxe`` and ``ipxe.efi``."""


class BootServer:
    """Boots the machines of the LAN on ``interface``, answering as ``address`` (an IPv4 address of that interface).

    ``on_record`` is told of everything served (``BootRecord``), on the event loop's thread; it must not block.
    """

    def __init__(
        self,
        *,
        interface: str,
        address: str,
        cache_dir: Path,
        on_record: Callable[[BootRecord], None],
        boot_files_dir: Path = DEFAULT_BOOT_FILES,
        http_port: int = 8080,
        tftp_port: int = 69,
        dhcp_ports: tuple[int, int, int] = (67, 4011, 68),
        plan: BootPlan | None = None,
    ) -> None:
        self.interface = interface
        self.address = address
        self._plan = plan or BootPlan()
        self._on_record = on_record
        self.marks = ChainMarks()
        self.cache = FileCache(cache_dir)
        self.http = HttpBootServer(
            address=address,
            port=http_port,
            plan=self.plan,
            cache=self.cache,
            record=self._record,
            mac_of=self.marks.mac_of,
            script_asked=self.marks.consume,
        )
        self.tftp = TftpServer(
            address=address,
            directory=boot_files_dir,
            names=(BIOS_FILE, EFI_FILE),
            finished=self._tftp_finished,
            port=tftp_port,
        )
        self._dhcp_ports = dhcp_ports
        self.dhcp: ProxyDhcp | None = None
        self._prefetch: set[asyncio.Task[None]] = set()
        self._started = False

    def plan(self) -> BootPlan:
        """The plan being served."""
        return self._plan

    def set_plan(self, plan: BootPlan) -> None:
        """Serve ``plan`` from now on, and fetch its files into the cache (in the background, once started)."""
        self._plan = plan
        if self._started:
            self._fetch_files(plan)

    async def start(self) -> None:
        """Bind every port (HTTP first: the DHCP answers name its URL) and start fetching the plan's files.

        Raises:
            OSError: a port could not be bound (not root, the interface or address does not exist, a port in use).
        """
        await self.http.start()
        try:
            await self.tftp.start()
            dhcp, pxe, client = self._dhcp_ports
            self.dhcp = ProxyDhcp(
                interface=self.interface,
                address=self.address,
                script_url=f"{self.http.base_url}/boot.ipxe",
                plan=self.plan,
                marks=self.marks,
                record=self._record,
                dhcp_port=dhcp,
                pxe_port=pxe,
                client_port=client,
            )
            await self.dhcp.start()
        except BaseException:
            await self.stop()
            raise
        self._started = True
        self._fetch_files(self._plan)
        log.info(
            "serving on %s: proxy DHCP, TFTP %s:%d, HTTP %s",
            self.interface,
            self.address,
            self.tftp.port,
            self.http.base_url,
        )

    async def stop(self) -> None:
        """Close every port and stop the background fetches."""
        self._started = False
        if self.dhcp is not None:
            self.dhcp.stop()
            self.dhcp = None
        await self.tftp.stop()
        await self.http.stop()
        for task in list(self._prefetch):
            task.cancel()
        for task in list(self._prefetch):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        """Start, serve until cancelled, then stop."""
        await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    def _fetch_files(self, plan: BootPlan) -> None:
        for file in plan.files():
            if self.cache.path(file.sha256) is None:
                task = asyncio.ensure_future(self._fetch(file.sha256))
                self._prefetch.add(task)
                task.add_done_callback(self._prefetch.discard)

    async def _fetch(self, sha256: str) -> None:
        file = self._plan.file(sha256)
        if file is None:  # a newer plan no longer boots it
            return
        try:
            await self.cache.ensure(file)
        except CacheError as exc:
            log.warning("%s", exc)

    def _tftp_finished(self, ip: str, name: str, size: int) -> None:
        mac = self.marks.mac_of(ip)
        if mac is not None:
            self.marks.chained(mac)
        entry = self._plan.find(mac)
        self._record(
            BootRecord(
                kind="tftp",
                mac=mac,
                system_uuid=None,
                machine_id=entry.machine_id if entry is not None else None,
                detail=f"{name} ({size} bytes) to {ip}",
                at=time.time(),
            )
        )

    def _record(self, record: BootRecord) -> None:
        try:
            self._on_record(record)
        except Exception:
            log.exception("on_record failed")
