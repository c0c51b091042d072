"""The certificates of the control plane's instruction-signing keys, sent beside each signed instruction.

They are public (a daemon checks each against its trust bundle), read with one function call and kept for
``SignerCertificates.ttl`` seconds, or read again at once for a key id not seen yet (a rotation elsewhere). The
gateway holds no signing key: it can only relay a signature the control plane made.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from bettercompute.modules.commands import EDGE
from bettercompute.modules.nodes import InstructionSignature
from bettercompute.ports import Store

__all__ = ["SignerCertificates"]


class SignerCertificates:
    """The current certificate (DER) of each instruction-signing key, by key id."""

    ttl = 30.0
    """Seconds a read is reused (a certificate is renewed hours before it ends, so this is never too late)."""

    def __init__(self, store: Store, *, timer: Callable[[], float] = time.monotonic) -> None:
        self._store = store
        self._timer = timer
        self._read_at = -self.ttl
        self._certificates: dict[str, bytes] = {}

    async def certificate(self, instruction: InstructionSignature | None) -> bytes:
        """The certificate to send with ``instruction``: empty when it is unsigned or its key is retired (the
        daemon then refuses it, as it must)."""
        if instruction is None:
            return b""
        stale = self._timer() - self._read_at >= self.ttl
        if stale or instruction.signer not in self._certificates:
            self._certificates = await self._store.repository(EDGE).signers()
            self._read_at = self._timer()
        return self._certificates.get(instruction.signer, b"")

    def signature(self, instruction: InstructionSignature | None) -> bytes:
        """The signature bytes of ``instruction`` (empty when unsigned)."""
        return instruction.signature if instruction is not None else b""
