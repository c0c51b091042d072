"""The PostgreSQL side of the ``images`` module."""
