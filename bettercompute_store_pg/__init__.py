"""The PostgreSQL store for Better Compute: ``PgStore`` (``bettercompute.ports.Store``), ``PgNotifier`` and an
embedded server for development and tests."""

from ._embedded import EmbeddedPostgres as EmbeddedPostgres
from ._notifier import PgNotifier as PgNotifier
from ._store import PgStore as PgStore
from ._store import PgTransaction as PgTransaction

__all__ = ["EmbeddedPostgres", "PgNotifier", "PgStore", "PgTransaction", "__version__"]

__version__ = "0.1.0"
