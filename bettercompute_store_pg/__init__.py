"""The PostgreSQL store for Better Compute: ``PgStore`` (``bettercompute.ports.Store``), ``PgNotifier`` and an
embedded server for development and tests.

``PgRepository`` is the base of every repository adapter, the store's and other packages' (IAM's, a module of
your own: its key names the Python module of its adapters, see ``bettercompute.ports.Repository``): made from the
store's ``Database``, reached as ``store.repository(KEY)`` and, bound to a transaction, ``tx.repository(KEY)``;
``PartialUpdate`` builds an adapter's ``UPDATE`` of whichever declared columns a call sets.
``quote_schema``, ``translated``, ``connection_of`` and ``fetch_in`` are for other PostgreSQL statements of other
packages, so that their SQL lands in the store's schema, runs on the connection of the caller's transaction, and
has its driver errors translated the same way.
"""

from ._db import Database as Database
from ._db import PoolUsage as PoolUsage
from ._db import Statement as Statement
from ._db import fetch_in as fetch_in
from ._embedded import EmbeddedPostgres as EmbeddedPostgres
from ._embedded import database_url_from_env as database_url_from_env
from ._errors import translated as translated
from ._notifier import PgNotifier as PgNotifier
from ._repository import PartialUpdate as PartialUpdate
from ._repository import PgRepository as PgRepository
from ._roles import RoleNames as RoleNames
from ._schema import quote_schema as quote_schema
from ._sealed import sealed_column as sealed_column
from ._store import PgStore as PgStore
from ._transaction import PgTransaction as PgTransaction
from ._transaction import connection_of as connection_of

__all__ = [
    "Database",
    "EmbeddedPostgres",
    "PartialUpdate",
    "PgNotifier",
    "PgRepository",
    "PgStore",
    "PgTransaction",
    "PoolUsage",
    "RoleNames",
    "Statement",
    "__version__",
    "connection_of",
    "database_url_from_env",
    "fetch_in",
    "quote_schema",
    "sealed_column",
    "translated",
]

__version__ = "0.1.0"
