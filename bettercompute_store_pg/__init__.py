"""The PostgreSQL store for Better Compute: ``PgStore`` (``bettercompute.ports.Store``), ``PgNotifier`` and an
embedded server for development and tests.

``quote_schema`` and ``translated`` are for the PostgreSQL adapters of other packages (IAM's, later metal's and
VPS's), so that their SQL lands in the store's schema and their driver errors are translated the same way.
"""

from ._embedded import EmbeddedPostgres as EmbeddedPostgres
from ._embedded import database_url_from_env as database_url_from_env
from ._errors import translated as translated
from ._notifier import PgNotifier as PgNotifier
from ._schema import quote_schema as quote_schema
from ._store import PgStore as PgStore
from ._store import PgTransaction as PgTransaction

__all__ = [
    "EmbeddedPostgres",
    "PgNotifier",
    "PgStore",
    "PgTransaction",
    "__version__",
    "database_url_from_env",
    "quote_schema",
    "translated",
]

__version__ = "0.1.0"
