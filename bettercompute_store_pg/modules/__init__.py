"""The PostgreSQL side of each module, by name."""
