"""An example custom deployment: a central IAM, api processes that ask it (``RemoteIam``), workers and gateways,
each a process of its own over one PostgreSQL, composed by the host's own code rather than by ``better-compute``.

- ``setup`` (once per deploy): every migration, the node CA's keys, the root admin and the credential of the service
  account the other processes present to the central IAM.
- ``iam``: the only process that embeds IAM; it serves IAM's methods and the ``authz`` group, and runs IAM's jobs.
- ``api``: the HTTP API with ``RemoteIam``; no worker role, so it scales behind a load balancer.
- ``worker``: the ``controllers``, ``scheduler`` and ``sinks`` roles under leases (node adoption, reservations,
  webhooks); no HTTP.
- ``gateway``: the gRPC gateway that node daemons join through and hold their mutual-TLS sessions with.

Run each part with ``python -m examples.custom_deployment PART --help``; README.md in this folder gives the order.
"""

from examples.custom_deployment._cli import main as main
from examples.custom_deployment._compose import Deployment as Deployment
from examples.custom_deployment._compose import Parts as Parts
from examples.custom_deployment._compose import central as central
from examples.custom_deployment._compose import compose as compose
from examples.custom_deployment._compose import edge as edge
from examples.custom_deployment._parts import Minted as Minted
from examples.custom_deployment._parts import run_api as run_api
from examples.custom_deployment._parts import run_gateway as run_gateway
from examples.custom_deployment._parts import run_iam as run_iam
from examples.custom_deployment._parts import run_worker as run_worker
from examples.custom_deployment._parts import setup as setup

__all__ = [
    "Deployment",
    "Minted",
    "Parts",
    "central",
    "compose",
    "edge",
    "main",
    "run_api",
    "run_gateway",
    "run_iam",
    "run_worker",
    "setup",
]
