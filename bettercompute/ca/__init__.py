"""The node certificate authority: SPIFFE certificates for nodes, sites and ramdisks (see ``CertificateAuthority``).

Used by JoinService and renewal; the gateway only verifies against ``trust_bundle()`` and asks ``is_revoked``.
Limits and names are class attributes: ``CertificateAuthority.ROLES``, ``RAMDISK_MAX_TTL``, ``DEFAULT_TTL``,
``CLOCK_SKEW`` and ``REVOKED_EVENT`` (``"certificate.revoked"``, keyed by SPIFFE ID).
"""

from __future__ import annotations

from ._authority import CertificateAuthority, IssuedBundle, RevocationResult, serial_hex

__all__ = ["CertificateAuthority", "IssuedBundle", "RevocationResult", "serial_hex"]
