"""The client of the gateway's ``Call`` RPC: a module's method by name, a JSON object in and a JSON object out
(``docs/metal-wire.md``). ``bcd site`` and ``bcd ramdisk`` speak to the control plane only through it.

A refusal arrives as a gRPC status whose message is the project's error envelope (``{"error": {"code", "message",
"details", "retryable"}}``); ``call`` raises it as a ``CallError`` carrying those fields, so a caller decides on the
code and reason rather than on the text. A gateway that cannot be reached raises ``GatewayUnreachable``.

``client_context`` makes the TLS context of such a call, with a client certificate held in memory (a ramdisk keeps
nothing on disk): Python's ``ssl`` loads a certificate only from a file, so the certificate and its key are written
to a private temporary directory (``/dev/shm`` when there is one), loaded, and removed before it returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

import bettercompute_proto as wire

from ._errors import CallError, DaemonError, GatewayUnreachable
from .identity import NodeKey

__all__ = ["CALL_TIMEOUT", "CallError", "GatewayUnreachable", "call", "certificate_for", "client_context"]

CALL_TIMEOUT = 30.0
"""Seconds a call may take by default."""


async def call(
    target: Channel | wire.NodeStub, method: str, input: Mapping[str, Any], *, wait: float = CALL_TIMEOUT
) -> dict[str, Any]:
    """Call ``method`` with ``input``; its output.

    Args:
        target: A channel to the gateway, or a stub on one (the caller closes it).
        method: ``<area>.<name>``, such as ``ramdisk.task``.
        input: The input, a JSON object.
        wait: Seconds the call may take.

    Raises:
        CallError: the call was refused (the envelope's code, message and details).
        GatewayUnreachable: no answer came.
        DaemonError: the answer is not a JSON object.
        ValueError: ``input`` cannot be said in JSON.
    """
    stub = target if isinstance(target, wire.NodeStub) else wire.NodeStub(target)
    request = wire.CallRequest(
        method=method, input_json=json.dumps(dict(input), separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    )
    try:
        reply = await stub.call(request, timeout=wait)
    except GRPCError as exc:
        raise CallError.from_grpc(method, exc) from None
    except (OSError, StreamTerminatedError, ssl.SSLError, TimeoutError) as exc:
        raise GatewayUnreachable(f"{method}: the gateway could not be reached ({type(exc).__name__})") from None
    try:
        output = json.loads(reply.output_json)
    except ValueError:
        output = None
    if not isinstance(output, dict):
        raise DaemonError(f"{method}: the gateway answered something that is not a JSON object")
    return output


def client_context(
    bundle_pem: str, *, certificate_pem: str | None = None, key_pem: bytes | None = None
) -> ssl.SSLContext:
    """A TLS client context that trusts ``bundle_pem``, with the client certificate (and its chain) and key when
    given, loaded without leaving them on disk (see the module docstring).

    Raises:
        ssl.SSLError: the bundle, certificate or key does not load, or the key is not the certificate's.
        ValueError: only one of the certificate and the key is given.
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=bundle_pem)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    if certificate_pem is None and key_pem is None:
        return context
    if certificate_pem is None or key_pem is None:
        raise ValueError("a client certificate goes with its key")
    shm = Path("/dev/shm")  # noqa: S108 - memory, not a disk; mkdtemp makes a fresh 0700 folder in it
    folder = tempfile.mkdtemp(prefix="bcd-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None)
    path = Path(folder) / "client.pem"
    try:
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
            file.write(key_pem + b"\n" + certificate_pem.encode())
        context.load_cert_chain(certfile=str(path))
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        os.rmdir(folder)
    return context


def certificate_for(certificate_pem: str, key: NodeKey, spiffe_suffix: str) -> x509.Certificate:
    """The certificate a join answered, once checked to be for ``key`` and for a SPIFFE ID ending in
    ``spiffe_suffix`` (``/ramdisk/<machine-id>``, ``/site/<site-id>``).

    Raises:
        DaemonError: it does not load, or it is another key's or another identity's.
    """
    try:
        loaded = x509.load_pem_x509_certificate(certificate_pem.encode())
        names = loaded.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = names.get_values_for_type(x509.UniformResourceIdentifier)
    except (ValueError, x509.ExtensionNotFound):
        raise DaemonError("the join answered a certificate that cannot be read") from None
    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if loaded.public_key().public_bytes(der, spki) != key.private_key.public_key().public_bytes(der, spki):
        raise DaemonError("the join answered a certificate for another key")
    if not any(u.startswith("spiffe://") and u.endswith(spiffe_suffix) for u in uris):
        raise DaemonError(f"the join answered a certificate whose SPIFFE ID does not end in {spiffe_suffix}")
    return loaded
