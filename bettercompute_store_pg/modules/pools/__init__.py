"""The PostgreSQL side of the ``pools`` module."""
