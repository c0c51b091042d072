"""The PostgreSQL side of the ``secrets`` module."""
