"""The ``nodes`` module: joined machines (the ``nodes`` group), the one-time tokens that join them (``join-tokens``),
and node identity: JoinService (join with a sealed one-time token, renewal with proof of possession), the node CA,
the attestor chain's plugin point, and ``GatewayServices``, what a gateway relays ``Join``, ``Renew``, ``Secret``,
``Call`` and ``Tunnel`` to.

``compute.gateway_services`` is the control plane's instance (``Options.join`` and ``Options.kms`` set, after
``initialize()``). What a daemon signs is defined by ``renew_message`` and ``secret_message``.
"""

from bettercompute.modules.nodes._ca import CertificateAuthority as CertificateAuthority
from bettercompute.modules.nodes._ca import IssuedBundle as IssuedBundle
from bettercompute.modules.nodes._ca import RevocationResult as RevocationResult
from bettercompute.modules.nodes._ca import ca_key_context as ca_key_context
from bettercompute.modules.nodes._ca import trust_bundle_pem_of as trust_bundle_pem_of
from bettercompute.modules.nodes._claims import AttestationRequest as AttestationRequest
from bettercompute.modules.nodes._claims import Attestor as Attestor
from bettercompute.modules.nodes._claims import ClaimsAttestor as ClaimsAttestor
from bettercompute.modules.nodes._claims import HardwareClaims as HardwareClaims
from bettercompute.modules.nodes._claims import hardware_key as hardware_key
from bettercompute.modules.nodes._desired import DESIRED_STATE_CHANNEL as DESIRED_STATE_CHANNEL
from bettercompute.modules.nodes._desired import MAX_DESIRED_STATE_BYTES as MAX_DESIRED_STATE_BYTES
from bettercompute.modules.nodes._desired import poke_gateways as poke_gateways
from bettercompute.modules.nodes._desired import set_desired_state as set_desired_state
from bettercompute.modules.nodes._facts import FACT_REFUSED_ACTION as FACT_REFUSED_ACTION
from bettercompute.modules.nodes._facts import ack_refusal as ack_refusal
from bettercompute.modules.nodes._facts import audit_refusal as audit_refusal
from bettercompute.modules.nodes._facts import command_result_message as command_result_message
from bettercompute.modules.nodes._facts import desired_ack_message as desired_ack_message
from bettercompute.modules.nodes._facts import fact_refusal as fact_refusal
from bettercompute.modules.nodes._facts import inventory_section_message as inventory_section_message
from bettercompute.modules.nodes._facts import section_refusal as section_refusal
from bettercompute.modules.nodes._gateway import GatewayServices as GatewayServices
from bettercompute.modules.nodes._gateway import ServerCertificate as ServerCertificate
from bettercompute.modules.nodes._gateway_enrolment import GATEWAY_TOKEN_PREFIX as GATEWAY_TOKEN_PREFIX
from bettercompute.modules.nodes._gateway_enrolment import GatewayEnrolment as GatewayEnrolment
from bettercompute.modules.nodes._gateway_enrolment import parse_gateway_token as parse_gateway_token
from bettercompute.modules.nodes._install import bundle_pin as bundle_pin
from bettercompute.modules.nodes._install import install_script as install_script
from bettercompute.modules.nodes._instructions import InstructionSigner as InstructionSigner
from bettercompute.modules.nodes._instructions import Signing as Signing
from bettercompute.modules.nodes._instructions import command_message as command_message
from bettercompute.modules.nodes._instructions import deadline_ms as deadline_ms
from bettercompute.modules.nodes._instructions import desired_state_message as desired_state_message
from bettercompute.modules.nodes._instructions import prepared_signer as prepared_signer
from bettercompute.modules.nodes._instructions import register_signer as register_signer
from bettercompute.modules.nodes._instructions import signer_of as signer_of
from bettercompute.modules.nodes._instructions import signing_key_context as signing_key_context
from bettercompute.modules.nodes._inventory import ACKED_KIND as ACKED_KIND
from bettercompute.modules.nodes._inventory import INVENTORY_KIND as INVENTORY_KIND
from bettercompute.modules.nodes._inventory import INVENTORY_REPORTED as INVENTORY_REPORTED
from bettercompute.modules.nodes._inventory import INVENTORY_SECTIONS as INVENTORY_SECTIONS
from bettercompute.modules.nodes._inventory import LIFECYCLE_KIND as LIFECYCLE_KIND
from bettercompute.modules.nodes._inventory import NODE_REPORTED as NODE_REPORTED
from bettercompute.modules.nodes._inventory import acked_item as acked_item
from bettercompute.modules.nodes._inventory import inventory_item as inventory_item
from bettercompute.modules.nodes._inventory import lifecycle_item as lifecycle_item
from bettercompute.modules.nodes._join import JoinResult as JoinResult
from bettercompute.modules.nodes._join import JoinService as JoinService
from bettercompute.modules.nodes._join import hardware_key_of as hardware_key_of
from bettercompute.modules.nodes._join_keys import join_key_context as join_key_context
from bettercompute.modules.nodes._join_tokens import JOIN_TOKEN as JOIN_TOKEN
from bettercompute.modules.nodes._join_tokens import join_command as join_command
from bettercompute.modules.nodes._join_tokens import token_state as token_state
from bettercompute.modules.nodes._methods import ACTIONS as ACTIONS
from bettercompute.modules.nodes._methods import JoinTokensGroup as JoinTokensGroup
from bettercompute.modules.nodes._methods import KeysGroup as KeysGroup
from bettercompute.modules.nodes._methods import NodesGroup as NodesGroup
from bettercompute.modules.nodes._module import NodesModule as NodesModule
from bettercompute.modules.nodes._port import CERTIFICATES as CERTIFICATES
from bettercompute.modules.nodes._port import JOIN_KEYS as JOIN_KEYS
from bettercompute.modules.nodes._port import JOIN_TOKENS as JOIN_TOKENS
from bettercompute.modules.nodes._port import NODES as NODES
from bettercompute.modules.nodes._port import REWRAPS as REWRAPS
from bettercompute.modules.nodes._port import SEALED_CA_KEYS as SEALED_CA_KEYS
from bettercompute.modules.nodes._port import SEALED_JOIN_KEYS as SEALED_JOIN_KEYS
from bettercompute.modules.nodes._port import SEALED_SIGNING_KEYS as SEALED_SIGNING_KEYS
from bettercompute.modules.nodes._port import CaKey as CaKey
from bettercompute.modules.nodes._port import Certificates as Certificates
from bettercompute.modules.nodes._port import ConditionRecord as ConditionRecord
from bettercompute.modules.nodes._port import DesiredState as DesiredState
from bettercompute.modules.nodes._port import Enrollment as Enrollment
from bettercompute.modules.nodes._port import InstructionSignature as InstructionSignature
from bettercompute.modules.nodes._port import InventoryRecord as InventoryRecord
from bettercompute.modules.nodes._port import IssuedCertificate as IssuedCertificate
from bettercompute.modules.nodes._port import JoinKeyRecord as JoinKeyRecord
from bettercompute.modules.nodes._port import JoinKeys as JoinKeys
from bettercompute.modules.nodes._port import JoinTokenMatch as JoinTokenMatch
from bettercompute.modules.nodes._port import JoinTokenRecord as JoinTokenRecord
from bettercompute.modules.nodes._port import JoinTokens as JoinTokens
from bettercompute.modules.nodes._port import NodeRecord as NodeRecord
from bettercompute.modules.nodes._port import Nodes as Nodes
from bettercompute.modules.nodes._port import Revocation as Revocation
from bettercompute.modules.nodes._port import RewrapRecord as RewrapRecord
from bettercompute.modules.nodes._port import Rewraps as Rewraps
from bettercompute.modules.nodes._port import SignedFact as SignedFact
from bettercompute.modules.nodes._port import SigningKey as SigningKey
from bettercompute.modules.nodes._port import TokenConsumption as TokenConsumption
from bettercompute.modules.nodes._proofs import CHALLENGE_BYTES as CHALLENGE_BYTES
from bettercompute.modules.nodes._proofs import RENEW_CONTEXT as RENEW_CONTEXT
from bettercompute.modules.nodes._proofs import SECRET_CONTEXT as SECRET_CONTEXT
from bettercompute.modules.nodes._proofs import renew_message as renew_message
from bettercompute.modules.nodes._proofs import secret_message as secret_message
from bettercompute.modules.nodes._proofs import verify_signature as verify_signature
from bettercompute.modules.nodes._renew import RenewResult as RenewResult
from bettercompute.modules.nodes._schemas import MAX_EXPIRY as MAX_EXPIRY
from bettercompute.modules.nodes._schemas import MAX_USES as MAX_USES
from bettercompute.modules.nodes._schemas import MIN_EXPIRY as MIN_EXPIRY
from bettercompute.modules.nodes._schemas import NODE as NODE
from bettercompute.modules.nodes._schemas import Condition as Condition
from bettercompute.modules.nodes._schemas import CordonNodeInput as CordonNodeInput
from bettercompute.modules.nodes._schemas import CreatedJoinToken as CreatedJoinToken
from bettercompute.modules.nodes._schemas import CreateJoinTokenInput as CreateJoinTokenInput
from bettercompute.modules.nodes._schemas import GetJoinTokenInput as GetJoinTokenInput
from bettercompute.modules.nodes._schemas import GetNodeInput as GetNodeInput
from bettercompute.modules.nodes._schemas import GetRewrapInput as GetRewrapInput
from bettercompute.modules.nodes._schemas import JoinExpect as JoinExpect
from bettercompute.modules.nodes._schemas import JoinToken as JoinToken
from bettercompute.modules.nodes._schemas import Key as Key
from bettercompute.modules.nodes._schemas import KeyKind as KeyKind
from bettercompute.modules.nodes._schemas import ListJoinTokensInput as ListJoinTokensInput
from bettercompute.modules.nodes._schemas import ListJoinTokensOutput as ListJoinTokensOutput
from bettercompute.modules.nodes._schemas import ListKeysInput as ListKeysInput
from bettercompute.modules.nodes._schemas import ListKeysOutput as ListKeysOutput
from bettercompute.modules.nodes._schemas import ListNodesInput as ListNodesInput
from bettercompute.modules.nodes._schemas import ListNodesOutput as ListNodesOutput
from bettercompute.modules.nodes._schemas import Node as Node
from bettercompute.modules.nodes._schemas import NodeState as NodeState
from bettercompute.modules.nodes._schemas import Reclaim as Reclaim
from bettercompute.modules.nodes._schemas import RequalifyNodeInput as RequalifyNodeInput
from bettercompute.modules.nodes._schemas import RetireKeyInput as RetireKeyInput
from bettercompute.modules.nodes._schemas import RetireNodeInput as RetireNodeInput
from bettercompute.modules.nodes._schemas import RevokedNode as RevokedNode
from bettercompute.modules.nodes._schemas import RevokeJoinTokenInput as RevokeJoinTokenInput
from bettercompute.modules.nodes._schemas import RevokeNodeInput as RevokeNodeInput
from bettercompute.modules.nodes._schemas import Rewrap as Rewrap
from bettercompute.modules.nodes._schemas import RewrapFailure as RewrapFailure
from bettercompute.modules.nodes._schemas import RotateKeyInput as RotateKeyInput
from bettercompute.modules.nodes._schemas import StartRewrapInput as StartRewrapInput
from bettercompute.modules.nodes._schemas import TokenState as TokenState
from bettercompute.modules.nodes._schemas import TunnelNodeInput as TunnelNodeInput
from bettercompute.modules.nodes._schemas import TunnelOutput as TunnelOutput
from bettercompute.modules.nodes._secrets import NodeIdentity as NodeIdentity
from bettercompute.modules.nodes._secrets import SecretReleaser as SecretReleaser
from bettercompute.modules.nodes._service import NODE_CORDONED as NODE_CORDONED
from bettercompute.modules.nodes._service import NODE_REQUALIFYING as NODE_REQUALIFYING
from bettercompute.modules.nodes._service import NODE_UNCORDONED as NODE_UNCORDONED
from bettercompute.modules.nodes._service import retire_node as retire_node
from bettercompute.modules.nodes._service import tunnel_output as tunnel_output
from bettercompute.modules.nodes._tokens import IDENTITY_NEEDS as IDENTITY_NEEDS
from bettercompute.modules.nodes._tokens import TOKEN_PREFIX as TOKEN_PREFIX
from bettercompute.modules.nodes._tokens import JoinSettings as JoinSettings
from bettercompute.modules.nodes._tokens import hash_secret as hash_secret
from bettercompute.modules.nodes._tokens import new_token as new_token
from bettercompute.modules.nodes._tokens import parse_token as parse_token
from bettercompute.modules.nodes._tokens import secret_matches as secret_matches
from bettercompute.modules.nodes._tunnels import STALE_AFTER as STALE_AFTER
from bettercompute.modules.nodes._tunnels import TICKET_PREFIX as TICKET_PREFIX
from bettercompute.modules.nodes._tunnels import TICKET_TTL as TICKET_TTL
from bettercompute.modules.nodes._tunnels import TUNNELS as TUNNELS
from bettercompute.modules.nodes._tunnels import TunnelCheck as TunnelCheck
from bettercompute.modules.nodes._tunnels import TunnelGrant as TunnelGrant
from bettercompute.modules.nodes._tunnels import TunnelRecord as TunnelRecord
from bettercompute.modules.nodes._tunnels import Tunnels as Tunnels
from bettercompute.modules.nodes._tunnels import TunnelTicket as TunnelTicket
from bettercompute.modules.nodes._tunnels import closed_record as closed_record
from bettercompute.modules.nodes._tunnels import open_tunnel_in as open_tunnel_in
from bettercompute.modules.nodes._tunnels import parse_ticket as parse_ticket
from bettercompute.modules.nodes._tunnels import sweep_tunnels as sweep_tunnels
from bettercompute.modules.nodes._x509 import serial_hex as serial_hex

__all__ = [
    "ACKED_KIND",
    "ACTIONS",
    "CERTIFICATES",
    "CHALLENGE_BYTES",
    "DESIRED_STATE_CHANNEL",
    "FACT_REFUSED_ACTION",
    "IDENTITY_NEEDS",
    "INVENTORY_KIND",
    "INVENTORY_REPORTED",
    "INVENTORY_SECTIONS",
    "JOIN_KEYS",
    "JOIN_TOKEN",
    "JOIN_TOKENS",
    "LIFECYCLE_KIND",
    "MAX_DESIRED_STATE_BYTES",
    "MAX_EXPIRY",
    "MAX_USES",
    "MIN_EXPIRY",
    "NODE",
    "NODES",
    "NODE_CORDONED",
    "NODE_REPORTED",
    "NODE_REQUALIFYING",
    "NODE_UNCORDONED",
    "RENEW_CONTEXT",
    "REWRAPS",
    "SEALED_CA_KEYS",
    "SEALED_JOIN_KEYS",
    "SEALED_SIGNING_KEYS",
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
    "ConditionRecord",
    "CordonNodeInput",
    "CreateJoinTokenInput",
    "CreatedJoinToken",
    "DesiredState",
    "Enrollment",
    "GatewayServices",
    "GetJoinTokenInput",
    "GetNodeInput",
    "GetRewrapInput",
    "HardwareClaims",
    "InstructionSignature",
    "InstructionSigner",
    "InventoryRecord",
    "IssuedBundle",
    "IssuedCertificate",
    "JoinExpect",
    "JoinKeyRecord",
    "JoinKeys",
    "JoinResult",
    "JoinService",
    "JoinSettings",
    "JoinToken",
    "JoinTokenMatch",
    "JoinTokenRecord",
    "JoinTokens",
    "JoinTokensGroup",
    "Key",
    "KeyKind",
    "KeysGroup",
    "ListJoinTokensInput",
    "ListJoinTokensOutput",
    "ListKeysInput",
    "ListKeysOutput",
    "ListNodesInput",
    "ListNodesOutput",
    "Node",
    "NodeIdentity",
    "NodeRecord",
    "NodeState",
    "Nodes",
    "NodesGroup",
    "NodesModule",
    "Reclaim",
    "RenewResult",
    "RequalifyNodeInput",
    "RetireKeyInput",
    "RetireNodeInput",
    "Revocation",
    "RevocationResult",
    "RevokeJoinTokenInput",
    "RevokeNodeInput",
    "RevokedNode",
    "Rewrap",
    "RewrapFailure",
    "RewrapRecord",
    "Rewraps",
    "RotateKeyInput",
    "SecretReleaser",
    "SignedFact",
    "Signing",
    "SigningKey",
    "StartRewrapInput",
    "TokenConsumption",
    "TokenState",
    "TunnelCheck",
    "TunnelGrant",
    "TunnelNodeInput",
    "TunnelOutput",
    "TunnelRecord",
    "TunnelTicket",
    "Tunnels",
    "ack_refusal",
    "acked_item",
    "audit_refusal",
    "bundle_pin",
    "ca_key_context",
    "closed_record",
    "command_message",
    "command_result_message",
    "deadline_ms",
    "desired_ack_message",
    "desired_state_message",
    "fact_refusal",
    "hardware_key",
    "hardware_key_of",
    "hash_secret",
    "install_script",
    "inventory_item",
    "inventory_section_message",
    "join_command",
    "join_key_context",
    "lifecycle_item",
    "new_token",
    "open_tunnel_in",
    "parse_ticket",
    "parse_token",
    "poke_gateways",
    "prepared_signer",
    "register_signer",
    "renew_message",
    "retire_node",
    "secret_matches",
    "secret_message",
    "section_refusal",
    "serial_hex",
    "set_desired_state",
    "signer_of",
    "signing_key_context",
    "sweep_tunnels",
    "token_state",
    "trust_bundle_pem_of",
    "tunnel_output",
    "verify_signature",
]
