"""``bcd site``: the boot server of a bare-metal site LAN (proxy DHCP, TFTP of iPXE, HTTP of scripts and files)."""

from bettercompute_daemon._site._cache import CacheError as CacheError
from bettercompute_daemon._site._cache import FileCache as FileCache
from bettercompute_daemon._site._plan import BootEntry as BootEntry
from bettercompute_daemon._site._plan import BootFile as BootFile
from bettercompute_daemon._site._plan import BootPlan as BootPlan
from bettercompute_daemon._site._plan import BootRecord as BootRecord
from bettercompute_daemon._site._server import DEFAULT_BOOT_FILES as DEFAULT_BOOT_FILES
from bettercompute_daemon._site._server import BootServer as BootServer

__all__ = [
    "DEFAULT_BOOT_FILES",
    "BootEntry",
    "BootFile",
    "BootPlan",
    "BootRecord",
    "BootServer",
    "CacheError",
    "FileCache",
]
