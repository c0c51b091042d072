"""The ``better-compute`` command: the composition root of Better Compute (``migrate``, ``serve``, ``dev``, ``iam``).

``load_config`` and ``Config`` are public so a host can read the same configuration the command does.
"""

import typing as _typing

from ._config import Config as Config
from ._config import load_config as load_config
from ._main import main as main
from ._version import __version__ as __version__

if _typing.TYPE_CHECKING:
    from ._app import app as app


def __getattr__(name: str) -> _typing.Any:
    # The typer application loads on first use: a client command (``main``) does without it.
    if name == "app":
        from ._app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Config", "__version__", "app", "load_config", "main"]
