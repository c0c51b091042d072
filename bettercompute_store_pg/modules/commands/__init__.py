"""The PostgreSQL side of the ``commands`` module."""
