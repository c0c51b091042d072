"""Node identity: JoinService (join with a sealed one-time token, renewal with proof of possession), the attestor
chain's plugin point, and ``GatewayServices``, what a gateway relays ``Join``, ``Renew`` and ``Secret`` to.

``compute.gateway_services`` is the control plane's instance (``Options.join`` and ``Options.kms`` set, after
``initialize()``). What a daemon signs is defined by ``renew_message`` and ``secret_message``.
"""

from ._claims import AttestationRequest, Attestor, ClaimsAttestor, HardwareClaims, hardware_key
from ._module import IdentityModule
from ._nodes import (
    GetNodeInput,
    ListNodesInput,
    ListNodesOutput,
    Node,
    NodesGroup,
    RetireNodeInput,
    RevokedNode,
    RevokeNodeInput,
)
from ._proofs import CHALLENGE_BYTES, RENEW_CONTEXT, SECRET_CONTEXT, renew_message, secret_message
from ._service import GatewayServices, JoinResult, JoinService, RenewResult

__all__ = [
    "CHALLENGE_BYTES",
    "RENEW_CONTEXT",
    "SECRET_CONTEXT",
    "AttestationRequest",
    "Attestor",
    "ClaimsAttestor",
    "GatewayServices",
    "GetNodeInput",
    "HardwareClaims",
    "IdentityModule",
    "JoinResult",
    "JoinService",
    "ListNodesInput",
    "ListNodesOutput",
    "Node",
    "NodesGroup",
    "RenewResult",
    "RetireNodeInput",
    "RevokeNodeInput",
    "RevokedNode",
    "hardware_key",
    "renew_message",
    "secret_message",
]
