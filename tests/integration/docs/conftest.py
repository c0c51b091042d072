"""The docs' tests start ``better-compute`` as the CLI's tests do, with the same fixtures."""

from ..cli.conftest import cli_env as cli_env
from ..cli.conftest import start_cli as start_cli
