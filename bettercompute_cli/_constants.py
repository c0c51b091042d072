"""Names shared by the entry point, the server commands and the client commands.

They live here, in a module that imports nothing of this package, so that ``_main``, ``_app`` and the client
command modules each import it rather than one another.
"""

from __future__ import annotations

__all__ = ["COMPLETE_VAR", "ENDPOINT", "OWN_COMMANDS"]

COMPLETE_VAR = "_BETTER_COMPUTE_COMPLETE"
"""Set by the shell's completion script (``better-compute completion bash``) when it asks for completions."""

ENDPOINT = "/api/compute"
"""The path under which a server serves the methods (``{ENDPOINT}/{group}/{method}``) and its OpenAPI document."""

OWN_COMMANDS: dict[str, str] = {
    "dev": "Run the whole control plane on this machine, for development.",
    "iam": "Administer the embedded Better IAM.",
    "gateways": "Enrol gateway processes that run apart from the api.",
    "facts": "Check again what a node signed and the control plane relies on.",
    "mcp": "Serve the control plane's methods as MCP tools, on stdio or over streamable HTTP.",
    "migrate": "Apply every pending migration, and print what was applied.",
    "serve": "Run one process mode of the control plane until stopped.",
    "version": "Print the versions of the command and the packages it composes.",
}
"""The server commands (``_app``), with a line each for shell completion (a unit test keeps the names in step)."""
