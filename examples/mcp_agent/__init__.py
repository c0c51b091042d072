"""An example agent's side of MCP: it starts ``better-compute mcp`` as a subprocess and talks to it over stdio, as
an AI agent's host (Claude Desktop, an IDE, an agent framework) does, then reserves a GPU with the tools it finds.

What an agent does, in order:

1. list the tools: one per method of the control plane, each with a JSON Schema of its arguments, read-only ones
   marked ``readOnlyHint``;
2. learn its tenant (``system_whoami``) and find the pool by name (``pools_list``);
3. reserve (``reservations_create``) with an ``idempotency_key``, so that a retry after a lost answer does not
   reserve twice; an answer with ``isError`` carries ``{"error": {"code", "message", ...}}``.

Run it with ``python -m examples.mcp_agent POOL_NAME`` against a running control plane (``better-compute dev``
prints the ``export TOKEN=...`` line it needs; ``BETTERCOMPUTE_URL`` names another server). An agent host's
configuration starts the same command: ``{"command": "better-compute", "args": ["mcp"], "env": {"TOKEN": ...}}``.
"""

from examples.mcp_agent._agent import AgentError as AgentError
from examples.mcp_agent._agent import Reserved as Reserved
from examples.mcp_agent._agent import reserve_gpu as reserve_gpu

__all__ = ["AgentError", "Reserved", "reserve_gpu"]
