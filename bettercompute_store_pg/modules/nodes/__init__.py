"""The PostgreSQL side of the ``nodes`` module."""
