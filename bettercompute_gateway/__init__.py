"""The gateway for node daemons: ``create_gateway(compute.gateway_services, store, tls, options)``.

Daemons dial out to it over gRPC with mutual TLS (``bettercompute_proto``); it relays ``Join``, ``Renew`` and
``Secret`` to the control plane's services (in process, or over the internal mutual-TLS channel to the api process:
``RemoteGatewayServices``, ``GatewayIdentity``), and holds their ``Session`` streams in memory, writing liveness in
batches. It carries tunnels (``Tunnel`` streams: a client's with a one-time ticket meets the node's, opened on its
session's connection; ``docs/tunnels.md``). It holds no CA key and no JoinService key.
"""

from bettercompute.modules.commands import SESSION_CLOSED as SESSION_CLOSED
from bettercompute.modules.commands import SESSION_OPENED as SESSION_OPENED
from bettercompute_gateway._errors import STATUS_OF as STATUS_OF
from bettercompute_gateway._gateway import Gateway as Gateway
from bettercompute_gateway._gateway import create_gateway as create_gateway
from bettercompute_gateway._identity import GatewayIdentity as GatewayIdentity
from bettercompute_gateway._internal import InternalListener as InternalListener
from bettercompute_gateway._internal import InternalServices as InternalServices
from bettercompute_gateway._internal import RemoteGatewayServices as RemoteGatewayServices
from bettercompute_gateway._options import GatewayOptions as GatewayOptions
from bettercompute_gateway._port import GatewayServicesPort as GatewayServicesPort
from bettercompute_gateway._tls import GatewayTls as GatewayTls
from bettercompute_gateway._tls import issue_tls as issue_tls
from bettercompute_gateway._tls import server_context as server_context
from bettercompute_gateway._tunnels import MAX_DATA_BYTES as MAX_DATA_BYTES
from bettercompute_gateway._tunnels import TunnelOptions as TunnelOptions

__version__ = "0.0.0"

__all__ = [
    "MAX_DATA_BYTES",
    "SESSION_CLOSED",
    "SESSION_OPENED",
    "STATUS_OF",
    "Gateway",
    "GatewayIdentity",
    "GatewayOptions",
    "GatewayServicesPort",
    "GatewayTls",
    "InternalListener",
    "InternalServices",
    "RemoteGatewayServices",
    "TunnelOptions",
    "__version__",
    "create_gateway",
    "issue_tls",
    "server_context",
]
