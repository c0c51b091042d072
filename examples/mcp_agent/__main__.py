"""``python -m examples.mcp_agent POOL_NAME [GPUS]``: reserve GPUs through ``better-compute mcp``."""

from __future__ import annotations

import json
import sys

import anyio

from examples.mcp_agent._agent import AgentError, reserve_gpu


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print("usage: python -m examples.mcp_agent POOL_NAME [GPUS]", file=sys.stderr)
        return 2
    gpus = int(sys.argv[2]) if len(sys.argv) == 3 else 1
    try:
        done = anyio.run(lambda: reserve_gpu(sys.argv[1], gpus=gpus))
    except AgentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(done.tools)} tools ({len(done.read_only)} read-only); pool {done.pool_id}")
    print(json.dumps(done.reservation, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
