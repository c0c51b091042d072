"""The PostgreSQL store for Better Compute: ``PgStore`` (``bettercompute.ports.Store``), ``PgNotifier`` and an
embedded server for development and tests.

``quote_schema``, ``translated``, ``connection_of`` and ``fetch_in`` are for the PostgreSQL adapters of other
packages (IAM's, later metal's and VPS's), so that their SQL lands in the store's schema, runs on the connection of
the caller's transaction, and has its driver errors translated the same way.
"""

from ._db import PoolUsage as PoolUsage
from ._db import Statement as Statement
from ._db import fetch_in as fetch_in
from ._embedded import EmbeddedPostgres as EmbeddedPostgres
from ._embedded import database_url_from_env as database_url_from_env
from ._errors import translated as translated
from ._notifier import PgNotifier as PgNotifier
from ._schema import quote_schema as quote_schema
from ._store import PgStore as PgStore
from ._transaction import PgTransaction as PgTransaction
from ._transaction import connection_of as connection_of

__all__ = [
    "EmbeddedPostgres",
    "PgNotifier",
    "PgStore",
    "PgTransaction",
    "PoolUsage",
    "Statement",
    "__version__",
    "connection_of",
    "database_url_from_env",
    "fetch_in",
    "quote_schema",
    "translated",
]

__version__ = "0.1.0"
