"""The ``better-compute`` command: the composition root of Better Compute (``migrate``, ``serve``, ``dev``, ``iam``).

``load_config`` and ``Config`` are public so a host can read the same configuration the command does.
"""

from ._app import app as app
from ._app import main as main
from ._config import Config as Config
from ._config import load_config as load_config
from ._version import __version__ as __version__

__all__ = ["Config", "__version__", "app", "load_config", "main"]
