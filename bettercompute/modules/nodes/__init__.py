"""Node identity: JoinService (join with a sealed one-time token, renewal with proof of possession), the attestor
chain's plugin point, and ``GatewayServices``, what a gateway relays ``Join``, ``Renew`` and ``Secret`` to.

``compute.gateway_services`` is the control plane's instance (``Options.join`` and ``Options.kms`` set, after
``initialize()``). What a daemon signs is defined by ``renew_message`` and ``secret_message``.
"""

from bettercompute.modules.nodes._ca import CertificateAuthority, IssuedBundle, RevocationResult, serial_hex
from bettercompute.modules.nodes._claims import (
    AttestationRequest,
    Attestor,
    ClaimsAttestor,
    HardwareClaims,
    hardware_key,
)
from bettercompute.modules.nodes._gateway import GatewayServices
from bettercompute.modules.nodes._join import JoinResult, JoinService
from bettercompute.modules.nodes._module import IdentityModule
from bettercompute.modules.nodes._nodes import (
    GetNodeInput,
    ListNodesInput,
    ListNodesOutput,
    Node,
    NodesGroup,
    RetireNodeInput,
    RevokedNode,
    RevokeNodeInput,
)
from bettercompute.modules.nodes._proofs import (
    CHALLENGE_BYTES,
    RENEW_CONTEXT,
    SECRET_CONTEXT,
    renew_message,
    secret_message,
)
from bettercompute.modules.nodes._renew import RenewResult
from bettercompute.modules.nodes._tokens import (
    TOKEN_PREFIX,
    JoinSettings,
    hash_secret,
    new_token,
    parse_token,
    secret_matches,
)

__all__ = [
    "CHALLENGE_BYTES",
    "RENEW_CONTEXT",
    "SECRET_CONTEXT",
    "TOKEN_PREFIX",
    "AttestationRequest",
    "Attestor",
    "CertificateAuthority",
    "ClaimsAttestor",
    "GatewayServices",
    "GetNodeInput",
    "HardwareClaims",
    "IdentityModule",
    "IssuedBundle",
    "JoinResult",
    "JoinService",
    "JoinSettings",
    "ListNodesInput",
    "ListNodesOutput",
    "Node",
    "NodesGroup",
    "RenewResult",
    "RetireNodeInput",
    "RevocationResult",
    "RevokeNodeInput",
    "RevokedNode",
    "hardware_key",
    "hash_secret",
    "new_token",
    "parse_token",
    "renew_message",
    "secret_matches",
    "secret_message",
    "serial_hex",
]
