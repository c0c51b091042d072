"""The PostgreSQL side of the ``audit`` module. It exports nothing: the store finds its adapters (``_repository.py``)
and migrations by the module's name."""

__all__: list[str] = []
