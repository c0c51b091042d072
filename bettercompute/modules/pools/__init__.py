"""The ``pools`` and ``join-tokens`` groups: pools of machines, and the one-time tokens that join machines to them."""

from bettercompute.modules.pools._methods import ACTIONS as ACTIONS
from bettercompute.modules.pools._methods import JoinTokensGroup as JoinTokensGroup
from bettercompute.modules.pools._methods import PoolsGroup as PoolsGroup
from bettercompute.modules.pools._module import PoolsModule as PoolsModule
from bettercompute.modules.pools._port import JOIN_TOKENS as JOIN_TOKENS
from bettercompute.modules.pools._port import POOLS as POOLS
from bettercompute.modules.pools._port import JoinTokenMatch as JoinTokenMatch
from bettercompute.modules.pools._port import JoinTokenRecord as JoinTokenRecord
from bettercompute.modules.pools._port import JoinTokens as JoinTokens
from bettercompute.modules.pools._port import PoolRecord as PoolRecord
from bettercompute.modules.pools._port import Pools as Pools
from bettercompute.modules.pools._port import TokenConsumption as TokenConsumption
from bettercompute.modules.pools._schemas import DEFAULT_ACCEPTANCE_CHECKS as DEFAULT_ACCEPTANCE_CHECKS
from bettercompute.modules.pools._schemas import LABELS as LABELS
from bettercompute.modules.pools._schemas import CreatedJoinToken as CreatedJoinToken
from bettercompute.modules.pools._schemas import CreateJoinTokenInput as CreateJoinTokenInput
from bettercompute.modules.pools._schemas import CreatePoolInput as CreatePoolInput
from bettercompute.modules.pools._schemas import GetJoinTokenInput as GetJoinTokenInput
from bettercompute.modules.pools._schemas import GetPoolInput as GetPoolInput
from bettercompute.modules.pools._schemas import JoinExpect as JoinExpect
from bettercompute.modules.pools._schemas import JoinToken as JoinToken
from bettercompute.modules.pools._schemas import ListJoinTokensInput as ListJoinTokensInput
from bettercompute.modules.pools._schemas import ListJoinTokensOutput as ListJoinTokensOutput
from bettercompute.modules.pools._schemas import ListPoolsInput as ListPoolsInput
from bettercompute.modules.pools._schemas import ListPoolsOutput as ListPoolsOutput
from bettercompute.modules.pools._schemas import NodePolicy as NodePolicy
from bettercompute.modules.pools._schemas import Pool as Pool
from bettercompute.modules.pools._schemas import RevokeJoinTokenInput as RevokeJoinTokenInput
from bettercompute.modules.pools._schemas import UpdatePoolInput as UpdatePoolInput
from bettercompute.modules.pools._service import join_command as join_command

__all__ = [
    "ACTIONS",
    "DEFAULT_ACCEPTANCE_CHECKS",
    "JOIN_TOKENS",
    "LABELS",
    "POOLS",
    "CreateJoinTokenInput",
    "CreatePoolInput",
    "CreatedJoinToken",
    "GetJoinTokenInput",
    "GetPoolInput",
    "JoinExpect",
    "JoinToken",
    "JoinTokenRecord",
    "JoinTokens",
    "JoinTokensGroup",
    "ListJoinTokensInput",
    "ListJoinTokensOutput",
    "ListPoolsInput",
    "ListPoolsOutput",
    "NodePolicy",
    "Pool",
    "PoolRecord",
    "Pools",
    "PoolsGroup",
    "PoolsModule",
    "RevokeJoinTokenInput",
    "TokenConsumption",
    "UpdatePoolInput",
    "join_command",
]
