"""The daemon's check of the instructions it is sent: it acts only on what the control plane signed for it.

A desired state or a command carries the control plane's signature and the certificate of the key that made it. The
certificate must come from the node CA of this node's trust bundle (issued directly by one of its CA certificates),
name ``spiffe://<trust-domain>/signer/<key-id>``, allow code signing only as a use, and be within its validity; the
signature must verify with its key over the instruction's canonical bytes, which hold this node's id (a state made
for another node does not verify here). A command past its signed deadline is refused too (no replay of an old one).

A gateway can therefore delay or drop what the control plane decided, never make it up or change it. Each refusal
has a short reason: ``unsigned``, ``bad_signer`` (the certificate), ``bad_signature`` or ``expired``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from collections.abc import Callable

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

import bettercompute_proto as wire

__all__ = ["InstructionCheck"]

_MAX_CERTIFICATE_BYTES = 8 * 1024
_MAX_SIGNATURE_BYTES = 1024


class InstructionCheck:
    """Checks signed instructions for one node.

    Args:
        bundle: The node's current trust bundle as PEM (read again when a certificate not seen yet comes).
        trust_domain: The node's trust domain.
        clock: Seconds since the epoch (tests inject one).
    """

    def __init__(self, bundle: Callable[[], bytes], *, trust_domain: str, clock: Callable[[], float] = time.time):
        self._bundle = bundle
        self._prefix = f"spiffe://{trust_domain}/signer/"
        self._clock = clock
        self._keys: dict[bytes, tuple[ec.EllipticCurvePublicKey, dt.datetime, dt.datetime]] = {}

    def desired_state(self, node_id: str, desired: wire.DesiredState) -> str | None:
        """Why ``desired`` is refused for node ``node_id``, or ``None`` when the control plane signed it."""
        message = wire.desired_state_message(
            node_id=node_id, generation=desired.generation, content_json=desired.content_json
        )
        return self._refusal(desired.signature, desired.signer_certificate, message)

    def command(self, node_id: str, command: wire.Command) -> str | None:
        """Why ``command`` is refused for node ``node_id``, or ``None`` when the control plane signed it for this
        node and its deadline has not passed."""
        message = wire.command_message(
            command_id=command.id,
            node_id=node_id,
            kind=command.kind,
            arguments_json=command.arguments_json,
            deadline_ms=command.deadline_ms,
        )
        refusal = self._refusal(command.signature, command.signer_certificate, message)
        if refusal is None and command.deadline_ms <= self._clock() * 1000:
            return "expired"
        return refusal

    def _refusal(self, signature: bytes, certificate: bytes, message: bytes) -> str | None:
        if not signature or not certificate:
            return "unsigned"
        if len(signature) > _MAX_SIGNATURE_BYTES:
            return "bad_signature"
        key = self._signer(certificate)
        if key is None:
            return "bad_signer"
        try:
            key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return "bad_signature"
        return None

    def _signer(self, certificate: bytes) -> ec.EllipticCurvePublicKey | None:
        """The key of a signer certificate this node trusts now, or ``None``."""
        if len(certificate) > _MAX_CERTIFICATE_BYTES:
            return None
        digest = hashlib.sha256(certificate).digest()
        known = self._keys.get(digest)
        if known is None:
            known = self._checked(certificate)
            if known is None:
                return None
            self._keys[digest] = known
        key, not_before, not_after = known
        now = dt.datetime.fromtimestamp(self._clock(), dt.UTC)
        return key if not_before <= now <= not_after else None

    def _checked(self, der: bytes) -> tuple[ec.EllipticCurvePublicKey, dt.datetime, dt.datetime] | None:
        try:
            certificate = x509.load_der_x509_certificate(der)
            names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            uses = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
            constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
        except (ValueError, x509.ExtensionNotFound):
            return None
        uris = names.get_values_for_type(x509.UniformResourceIdentifier)
        if len(uris) != 1 or not uris[0].startswith(self._prefix) or len(uris[0]) == len(self._prefix):
            return None
        if list(uses) != [ExtendedKeyUsageOID.CODE_SIGNING] or constraints.ca:
            return None
        key = certificate.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey) or not self._issued_by_bundle(certificate):
            return None
        return key, certificate.not_valid_before_utc, certificate.not_valid_after_utc

    def _issued_by_bundle(self, certificate: x509.Certificate) -> bool:
        try:
            authorities = x509.load_pem_x509_certificates(self._bundle())
        except (OSError, ValueError):
            return False
        for authority in authorities:
            try:
                constraints = authority.extensions.get_extension_for_class(x509.BasicConstraints).value
                if not constraints.ca:
                    continue
                certificate.verify_directly_issued_by(authority)
            except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
                continue
            return True
        return False
