"""Reserved for a later release: only the package name and its import rules exist so far."""

__version__ = "0.0.0"

__all__ = ["__version__"]
