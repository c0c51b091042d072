"""The PostgreSQL side of the ``runtime`` module."""
