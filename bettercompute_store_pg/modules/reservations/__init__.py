"""The PostgreSQL side of the ``reservations`` module."""
