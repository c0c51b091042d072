"""The PostgreSQL side of the ``commands`` module; ``NODE_KEYS``, the foreign keys to ``nodes`` that whichever of
``commands`` and ``nodes`` migrates second makes."""

from bettercompute_store_pg.modules.commands._migrations import NODE_KEYS as NODE_KEYS

__all__ = ["NODE_KEYS"]
