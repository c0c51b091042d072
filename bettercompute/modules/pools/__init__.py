"""The ``pools`` group: pools of machines, each of a class (``gpu``, ``vps-host``, ``provider``), with its acceptance
checks, labels and node policy. The join tokens that join machines to a pool are the ``nodes`` module's."""

from bettercompute.modules.pools._methods import ACTIONS as ACTIONS
from bettercompute.modules.pools._methods import PoolsGroup as PoolsGroup
from bettercompute.modules.pools._module import PoolsModule as PoolsModule
from bettercompute.modules.pools._port import POOLS as POOLS
from bettercompute.modules.pools._port import PoolRecord as PoolRecord
from bettercompute.modules.pools._port import Pools as Pools
from bettercompute.modules.pools._schemas import DEFAULT_ACCEPTANCE_CHECKS as DEFAULT_ACCEPTANCE_CHECKS
from bettercompute.modules.pools._schemas import LABELS as LABELS
from bettercompute.modules.pools._schemas import CreatePoolInput as CreatePoolInput
from bettercompute.modules.pools._schemas import GetPoolInput as GetPoolInput
from bettercompute.modules.pools._schemas import ListPoolsInput as ListPoolsInput
from bettercompute.modules.pools._schemas import ListPoolsOutput as ListPoolsOutput
from bettercompute.modules.pools._schemas import NodePolicy as NodePolicy
from bettercompute.modules.pools._schemas import Pool as Pool
from bettercompute.modules.pools._schemas import UpdatePoolInput as UpdatePoolInput
from bettercompute.modules.pools._service import POOL as POOL

__all__ = [
    "ACTIONS",
    "DEFAULT_ACCEPTANCE_CHECKS",
    "LABELS",
    "POOL",
    "POOLS",
    "CreatePoolInput",
    "GetPoolInput",
    "ListPoolsInput",
    "ListPoolsOutput",
    "NodePolicy",
    "Pool",
    "PoolRecord",
    "Pools",
    "PoolsGroup",
    "PoolsModule",
    "UpdatePoolInput",
]
