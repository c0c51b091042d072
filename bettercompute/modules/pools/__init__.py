"""The ``pools`` and ``join-tokens`` groups: pools of machines, and the one-time tokens that join machines to them."""

from ._methods import ACTIONS as ACTIONS
from ._methods import JoinTokensGroup as JoinTokensGroup
from ._methods import PoolsGroup as PoolsGroup
from ._module import PoolsModule as PoolsModule
from ._schemas import DEFAULT_ACCEPTANCE_CHECKS as DEFAULT_ACCEPTANCE_CHECKS
from ._schemas import CreatedJoinToken as CreatedJoinToken
from ._schemas import CreateJoinTokenInput as CreateJoinTokenInput
from ._schemas import CreatePoolInput as CreatePoolInput
from ._schemas import GetJoinTokenInput as GetJoinTokenInput
from ._schemas import GetPoolInput as GetPoolInput
from ._schemas import JoinExpect as JoinExpect
from ._schemas import JoinToken as JoinToken
from ._schemas import ListJoinTokensInput as ListJoinTokensInput
from ._schemas import ListJoinTokensOutput as ListJoinTokensOutput
from ._schemas import ListPoolsInput as ListPoolsInput
from ._schemas import ListPoolsOutput as ListPoolsOutput
from ._schemas import Pool as Pool
from ._schemas import RevokeJoinTokenInput as RevokeJoinTokenInput
from ._schemas import UpdatePoolInput as UpdatePoolInput
from ._service import join_command as join_command

__all__ = [
    "ACTIONS",
    "DEFAULT_ACCEPTANCE_CHECKS",
    "CreateJoinTokenInput",
    "CreatePoolInput",
    "CreatedJoinToken",
    "GetJoinTokenInput",
    "GetPoolInput",
    "JoinExpect",
    "JoinToken",
    "JoinTokensGroup",
    "ListJoinTokensInput",
    "ListJoinTokensOutput",
    "ListPoolsInput",
    "ListPoolsOutput",
    "Pool",
    "PoolsGroup",
    "PoolsModule",
    "RevokeJoinTokenInput",
    "UpdatePoolInput",
    "join_command",
]
