"""The PostgreSQL side of the ``inventory`` module."""
