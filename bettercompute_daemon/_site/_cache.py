"""The site's file cache is the daemon's (``bettercompute_daemon._images``), shared with ``bcd node``'s VM images."""

from .._images import CacheError as CacheError
from .._images import FileCache as FileCache

__all__ = ["CacheError", "FileCache"]
