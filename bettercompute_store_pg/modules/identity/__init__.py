"""The PostgreSQL side of the ``identity`` module."""
