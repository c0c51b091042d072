"""A minimal client of QEMU's machine protocol (QMP) over its unix socket: one connection per command."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

__all__ = ["QmpError", "qmp"]


class QmpError(Exception):
    """The socket could not be reached, or QEMU answered with an error."""


async def qmp(socket_path: Path, command: str, arguments: dict[str, Any] | None = None, *, wait: float = 5.0) -> Any:
    """Run ``command``; its ``return`` value.

    Raises:
        QmpError: no connection, no answer within ``wait`` seconds, or an error answer.
    """
    try:
        async with asyncio.timeout(wait):
            reader, writer = await asyncio.open_unix_connection(str(socket_path))
            try:
                await _answer(reader)  # the greeting
                for name, args in (("qmp_capabilities", None), (command, arguments)):
                    request: dict[str, Any] = {"execute": name}
                    if args:
                        request["arguments"] = args
                    writer.write(json.dumps(request).encode() + b"\n")
                    await writer.drain()
                    answer = await _answer(reader)
                return answer
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError:
        raise QmpError(f"{command}: no answer from {socket_path} within {wait} s") from None
    except OSError as exc:
        raise QmpError(f"{command}: {socket_path}: {exc.strerror or type(exc).__name__}") from None


async def _answer(reader: asyncio.StreamReader) -> Any:
    """The next reply (events are skipped)."""
    while True:
        line = await reader.readline()
        if not line:
            raise QmpError("QEMU closed the connection")
        message = json.loads(line)
        if "QMP" in message:
            return message
        if "error" in message:
            raise QmpError(f"{message['error'].get('class')}: {message['error'].get('desc')}")
        if "return" in message:
            return message["return"]
