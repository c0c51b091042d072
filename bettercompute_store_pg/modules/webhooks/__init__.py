"""The PostgreSQL side of the ``webhooks`` module."""
