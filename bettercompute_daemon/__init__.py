"""``bcd``, the node daemon: it joins a pool with a one-time token and then holds one session with a gateway,
dialing out over gRPC with mutual TLS; it opens no listening port and imports nothing of the control plane."""

from bettercompute_daemon._agent import EXPIRED as EXPIRED
from bettercompute_daemon._agent import STOPPED as STOPPED
from bettercompute_daemon._agent import Agent as Agent
from bettercompute_daemon._agent import join as join
from bettercompute_daemon._agent import run_node as run_node
from bettercompute_daemon._cli import main as main
from bettercompute_daemon._config import JoinConfig as JoinConfig
from bettercompute_daemon._config import parse_join_command as parse_join_command
from bettercompute_daemon._errors import ConfigError as ConfigError
from bettercompute_daemon._errors import DaemonError as DaemonError
from bettercompute_daemon._inventory import Inventory as Inventory
from bettercompute_daemon._sim import SimOptions as SimOptions
from bettercompute_daemon._sim import SimStats as SimStats
from bettercompute_daemon._sim import Simulator as Simulator
from bettercompute_daemon._state import NodeConfig as NodeConfig
from bettercompute_daemon._state import NodeIdentity as NodeIdentity
from bettercompute_daemon._state import StateDir as StateDir

__version__ = "0.0.0"

__all__ = [
    "EXPIRED",
    "STOPPED",
    "Agent",
    "ConfigError",
    "DaemonError",
    "Inventory",
    "JoinConfig",
    "NodeConfig",
    "NodeIdentity",
    "SimOptions",
    "SimStats",
    "Simulator",
    "StateDir",
    "__version__",
    "join",
    "main",
    "parse_join_command",
    "run_node",
]
