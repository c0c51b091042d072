"""The control-plane fixture lives in ``tests/integration/conftest.py``; ``Plane`` is re-exported for imports."""

from ..conftest import Plane as Plane

__all__ = ["Plane"]
