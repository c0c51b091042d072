"""The kubeadm-style short form of ``bcd join``: ``--ca-pin sha256:<hex>`` instead of the whole CA bundle.

A pin is ``sha256:`` and 64 hex digits (either case): the SHA-256 of the bundle's certificates in DER, sorted
bytewise and concatenated. For a bundle of one certificate that is its usual SHA-256 fingerprint (``openssl x509
-noout -fingerprint -sha256``, without the colons). Sorting makes the pin independent of the order the PEM lists
them in; hashing DER makes it independent of line endings and PEM headers.

The daemon asks the gateway for the bundle (``TrustBundle``) over TLS that verifies nothing, for that one call only:
the pin is the check. Only a bundle that matches is trusted, and the join itself then verifies the gateway against
it. The control plane computes the same pin for ``join-tokens.create`` (``bettercompute.modules.pools``); the tests
hold the two against each other.
"""

from __future__ import annotations

import hashlib
import re
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

import bettercompute_proto as wire

from ._agent import refusal, split_address
from ._errors import DaemonError

__all__ = ["PIN_PREFIX", "bundle_pin", "fetch_pinned_bundle", "parse_pin"]

PIN_PREFIX = "sha256:"
_PIN = re.compile(r"sha256:[0-9a-fA-F]{64}")  # explicit ASCII ranges: no full-width or other digits


def parse_pin(text: str) -> str:
    """A pin as given (``--ca-pin``, ``ca_pin``), lower-cased.

    Raises:
        DaemonError: it is not ``sha256:`` and 64 ASCII hex digits.
    """
    if not _PIN.fullmatch(text):
        raise DaemonError("a CA pin is sha256: followed by 64 hex digits (0-9, a-f)")
    return text.lower()


def bundle_pin(bundle_pem: str) -> str:
    """The pin of a PEM bundle (see the module docstring).

    Raises:
        DaemonError: it holds no certificate, or one that does not parse.
    """
    try:
        certificates = x509.load_pem_x509_certificates(bundle_pem.encode())
    except ValueError:
        raise DaemonError("the CA bundle holds no readable certificate") from None
    ders = sorted(c.public_bytes(serialization.Encoding.DER) for c in certificates)
    return PIN_PREFIX + hashlib.sha256(b"".join(ders)).hexdigest()


def _unverified_context() -> ssl.SSLContext:
    # For TrustBundle only: nothing is trusted yet, and what comes back is kept only if it matches the pin.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    return context


async def fetch_pinned_bundle(gateway: str, pin: str, *, wait: float = 30.0) -> str:
    """The gateway's CA bundle (PEM), once its pin is ``pin``.

    Raises:
        DaemonError: the gateway could not be reached or refused, or its bundle does not match the pin.
    """
    pin = parse_pin(pin)
    host, port = split_address(gateway)
    channel = Channel(host, port, ssl=_unverified_context())
    try:
        reply = await wire.NodeStub(channel).trust_bundle(wire.TrustBundleRequest(), timeout=wait)
    except GRPCError as exc:
        raise DaemonError(f"the gateway {gateway} did not give its CA bundle: {refusal(exc)}") from None
    except (OSError, StreamTerminatedError, ssl.SSLError, TimeoutError) as exc:
        raise DaemonError(f"the gateway {gateway} could not be reached: {type(exc).__name__}") from None
    finally:
        channel.close()
    bundle = reply.trust_bundle_pem
    try:
        found = bundle_pin(bundle)
    except DaemonError:
        raise DaemonError(f"the gateway {gateway} answered a CA bundle with no readable certificate") from None
    if found != pin:
        raise DaemonError(
            f"the CA bundle of {gateway} does not match the CA pin (its pin is {found}): not trusted, nothing written"
        )
    return bundle
