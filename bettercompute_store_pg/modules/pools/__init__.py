"""The PostgreSQL side of the ``pools`` module; a pool's columns and row reader, for the adapters that read a pool
beside their own rows (a join token and its pool, in one statement)."""

from bettercompute_store_pg.modules.pools._repository import POOL_COLUMNS as POOL_COLUMNS
from bettercompute_store_pg.modules.pools._repository import pool_record as pool_record

__all__ = ["POOL_COLUMNS", "pool_record"]
