"""The attestor and the provisioning side's proof."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bettercompute.errors import AccessDeniedError
from bettercompute.modules.nodes import AttestationRequest

__all__ = ["EVIDENCE", "ProvisioningAttestor", "proof_for"]

EVIDENCE = "provisioning_proof"


def _proof(secret: bytes, serial: str, key_sha256: str) -> str:
    message = f"{serial.strip().casefold()}\n{key_sha256}".encode()
    return base64.b64encode(hmac.new(secret, message, hashlib.sha256).digest()).decode()


def proof_for(secret: bytes, serial: str, csr_pem: str) -> str:
    """The evidence a machine with ``serial`` sends with the certificate request ``csr_pem``."""
    key = x509.load_pem_x509_csr(csr_pem.encode()).public_key()
    spki = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return _proof(secret, serial, hashlib.sha256(spki).hexdigest())


@attrs.frozen(kw_only=True, repr=False)
class ProvisioningAttestor:
    """Admits a machine whose ``provisioning_proof`` matches its serial and its key; refuses any other."""

    secret: bytes
    name: str = "provisioning"

    def __repr__(self) -> str:
        return "ProvisioningAttestor(secret=<hidden>)"

    async def attest(self, request: AttestationRequest) -> Mapping[str, str]:
        """``{"proof": "verified"}``, or ``ACCESS_DENIED`` (reason ``provisioning_proof``)."""
        offered = request.evidence.get(EVIDENCE, "")
        serial = request.claims.serial or ""
        expected = _proof(self.secret, serial, request.csr_key_sha256)
        if not serial or not hmac.compare_digest(offered.encode(), expected.encode()):
            raise AccessDeniedError(
                "the machine did not prove it was provisioned", details={"reason": "provisioning_proof"}
            )
        return {"proof": "verified"}
