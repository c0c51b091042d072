"""The PostgreSQL side of the ``usage`` module."""
