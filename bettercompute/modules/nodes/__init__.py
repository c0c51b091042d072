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
from bettercompute.modules.nodes._desired import (
    DESIRED_STATE_CHANNEL,
    MAX_DESIRED_STATE_BYTES,
    poke_gateways,
    set_desired_state,
)
from bettercompute.modules.nodes._gateway import GatewayServices
from bettercompute.modules.nodes._inventory import (
    ACKED_KIND,
    INVENTORY_KIND,
    INVENTORY_REPORTED,
    INVENTORY_SECTIONS,
    LIFECYCLE_KIND,
    NODE_REPORTED,
    acked_item,
    inventory_item,
    lifecycle_item,
)
from bettercompute.modules.nodes._join import JoinResult, JoinService, hardware_key_of
from bettercompute.modules.nodes._module import IdentityModule
from bettercompute.modules.nodes._nodes import (
    NODE_CORDONED,
    NODE_REQUALIFYING,
    NODE_UNCORDONED,
    Condition,
    CordonNodeInput,
    GetNodeInput,
    ListNodesInput,
    ListNodesOutput,
    Node,
    NodesGroup,
    RequalifyNodeInput,
    RetireNodeInput,
    RevokedNode,
    RevokeNodeInput,
    TunnelNodeInput,
    TunnelOutput,
    tunnel_output,
)
from bettercompute.modules.nodes._port import CERTIFICATES as CERTIFICATES
from bettercompute.modules.nodes._port import JOIN_KEYS as JOIN_KEYS
from bettercompute.modules.nodes._port import NODES as NODES
from bettercompute.modules.nodes._port import CaKey as CaKey
from bettercompute.modules.nodes._port import Certificates as Certificates
from bettercompute.modules.nodes._port import DesiredState as DesiredState
from bettercompute.modules.nodes._port import Enrollment as Enrollment
from bettercompute.modules.nodes._port import InventoryRecord as InventoryRecord
from bettercompute.modules.nodes._port import IssuedCertificate as IssuedCertificate
from bettercompute.modules.nodes._port import JoinKeyRecord as JoinKeyRecord
from bettercompute.modules.nodes._port import JoinKeys as JoinKeys
from bettercompute.modules.nodes._port import NodeRecord as NodeRecord
from bettercompute.modules.nodes._port import Nodes as Nodes
from bettercompute.modules.nodes._port import Revocation as Revocation
from bettercompute.modules.nodes._proofs import (
    CHALLENGE_BYTES,
    RENEW_CONTEXT,
    SECRET_CONTEXT,
    renew_message,
    secret_message,
    verify_signature,
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
from bettercompute.modules.nodes._tunnels import (
    STALE_AFTER,
    TICKET_PREFIX,
    TICKET_TTL,
    TUNNELS,
    TunnelCheck,
    TunnelGrant,
    TunnelRecord,
    Tunnels,
    TunnelTicket,
    closed_record,
    open_tunnel_in,
    parse_ticket,
    sweep_tunnels,
)

__all__ = [
    "ACKED_KIND",
    "CERTIFICATES",
    "CHALLENGE_BYTES",
    "DESIRED_STATE_CHANNEL",
    "INVENTORY_KIND",
    "INVENTORY_REPORTED",
    "INVENTORY_SECTIONS",
    "JOIN_KEYS",
    "LIFECYCLE_KIND",
    "MAX_DESIRED_STATE_BYTES",
    "NODES",
    "NODE_CORDONED",
    "NODE_REPORTED",
    "NODE_REQUALIFYING",
    "NODE_UNCORDONED",
    "RENEW_CONTEXT",
    "SECRET_CONTEXT",
    "STALE_AFTER",
    "TICKET_PREFIX",
    "TICKET_TTL",
    "TOKEN_PREFIX",
    "TUNNELS",
    "AttestationRequest",
    "Attestor",
    "CaKey",
    "CertificateAuthority",
    "Certificates",
    "ClaimsAttestor",
    "Condition",
    "CordonNodeInput",
    "DesiredState",
    "Enrollment",
    "GatewayServices",
    "GetNodeInput",
    "HardwareClaims",
    "IdentityModule",
    "InventoryRecord",
    "IssuedBundle",
    "IssuedCertificate",
    "JoinKeyRecord",
    "JoinKeys",
    "JoinResult",
    "JoinService",
    "JoinSettings",
    "ListNodesInput",
    "ListNodesOutput",
    "Node",
    "NodeRecord",
    "Nodes",
    "NodesGroup",
    "RenewResult",
    "RequalifyNodeInput",
    "RetireNodeInput",
    "Revocation",
    "RevocationResult",
    "RevokeNodeInput",
    "RevokedNode",
    "TunnelCheck",
    "TunnelGrant",
    "TunnelNodeInput",
    "TunnelOutput",
    "TunnelRecord",
    "TunnelTicket",
    "Tunnels",
    "acked_item",
    "closed_record",
    "hardware_key",
    "hardware_key_of",
    "hash_secret",
    "inventory_item",
    "lifecycle_item",
    "new_token",
    "open_tunnel_in",
    "parse_ticket",
    "parse_token",
    "poke_gateways",
    "renew_message",
    "secret_matches",
    "secret_message",
    "serial_hex",
    "set_desired_state",
    "sweep_tunnels",
    "tunnel_output",
    "verify_signature",
]
