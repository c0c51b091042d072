"""The PostgreSQL side of the ``capacity`` module."""
