"""Hardware claims, the hardware key, and the attestor chain's plugin point with its built-in ``claims`` attestor."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from bettercompute.errors import AccessDeniedError, InvalidInputError
from bettercompute.modules.nodes._port import JoinTokenRecord
from bettercompute.modules.pools import PoolRecord

__all__ = [
    "AttestationRequest",
    "Attestor",
    "ClaimsAttestor",
    "HardwareClaims",
    "hardware_key",
]

_TEXT = re.compile(r"[\x21-\x7e]([\x20-\x7e]{0,126}[\x21-\x7e])?")
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")
MAX_GPUS = 1024
MAX_EVIDENCE = 16
MAX_EVIDENCE_BYTES = 64 * 1024


def _fail(attribute: attrs.Attribute[Any], value: Any, reason: str) -> ValueError:
    return ValueError(reason, attribute, value)


def _text(_: Any, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not _TEXT.fullmatch(value):
        raise _fail(attribute, value, "must be 1 to 128 printable ASCII characters, not starting or ending in a space")


def _hostname(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    if not _HOSTNAME.fullmatch(value):
        raise _fail(attribute, value, "must be a host name: letters, digits, '.' and '-', at most 253 characters")


def _count(_: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not 0 <= value <= MAX_GPUS:
        raise _fail(attribute, value, f"must be between 0 and {MAX_GPUS}")


def _uuids(_: Any, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if len(value) > MAX_GPUS:
        raise _fail(attribute, value, f"at most {MAX_GPUS} GPUs")
    for item in value:
        if not _TEXT.fullmatch(item):
            raise _fail(attribute, value, "each GPU UUID must be 1 to 128 printable ASCII characters")


@attrs.frozen(kw_only=True)
class HardwareClaims:
    """What a joining machine says about itself (``bcd`` reads it from SMBIOS and NVML).

    ``serial`` (the system serial number) and ``system_uuid`` (the SMBIOS system UUID) survive re-imaging; at least
    one of them is required, because the hardware key is made from them (with ``product``).
    """

    hostname: str = attrs.field(validator=_hostname)
    serial: str | None = attrs.field(default=None, validator=_text)
    system_uuid: str | None = attrs.field(default=None, validator=_text)
    product: str | None = attrs.field(default=None, validator=_text)
    vendor: str | None = attrs.field(default=None, validator=_text)
    gpu_model: str | None = attrs.field(default=None, validator=_text)
    gpu_count: int = attrs.field(default=0, validator=_count)
    gpu_uuids: tuple[str, ...] = attrs.field(default=(), validator=_uuids)

    def __attrs_post_init__(self) -> None:
        if self.serial is None and self.system_uuid is None:
            field = attrs.fields(HardwareClaims).serial
            raise _fail(field, None, "a serial or a system_uuid is required (the hardware key is made from them)")


def hardware_key(claims: HardwareClaims) -> str:
    """``hk_`` and the SHA-256 (hex) of the stable claims: product, serial and system UUID, case-folded.

    Re-imaging changes none of them; the hostname, the GPUs and the OS are left out on purpose (a renamed host or a
    replaced GPU is the same machine).
    """
    stable = {
        "product": (claims.product or "").strip().lower(),
        "serial": (claims.serial or "").strip().lower(),
        "system_uuid": (claims.system_uuid or "").strip().lower(),
    }
    digest = hashlib.sha256(json.dumps(stable, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"hk_{digest}"


@attrs.frozen(kw_only=True)
class AttestationRequest:
    """What an attestor judges: the claims, the attestor-specific ``evidence`` the daemon sent (a TPM quote, a
    cloud identity document: name to base64 text), the token and pool joined, and the SHA-256 (hex) of the public
    key in the CSR (so evidence can be bound to the key being certified)."""

    claims: HardwareClaims
    evidence: Mapping[str, str]
    token: JoinTokenRecord
    pool: PoolRecord
    csr_key_sha256: str


@runtime_checkable
class Attestor(Protocol):
    """One link of JoinService's attestor chain (``Options.attestors``), run in order after the built-in
    ``claims`` attestor, before anything is written and outside any database transaction.

    ``attest`` returns facts to record on the node (``{"tpm": "verified"}``; strings, may be empty) or refuses by
    raising a ``ComputeError`` (``AccessDeniedError`` for evidence that does not hold, ``UnavailableError`` when a
    service it needs is down). Any other exception refuses the join with ``INTERNAL``.
    """

    @property
    def name(self) -> str: ...

    async def attest(self, request: AttestationRequest) -> Mapping[str, str]: ...


@attrs.frozen
class ClaimsAttestor:
    """The built-in attestor: the claims must match the token's ``expect`` (serial, product, GPU model and count).

    Text claims compare without regard to case (as the hardware key does); a claim the token expects but the
    machine did not send is a mismatch. The refusal names the fields that did not match, never the expected
    values (they are the operator's).
    """

    name: str = "claims"

    async def attest(self, request: AttestationRequest) -> Mapping[str, str]:
        """Nothing to record on a match; ``AccessDeniedError`` (reason ``expect_mismatch``) otherwise."""
        expect = request.token.expect
        claims = request.claims
        mismatched: list[str] = []
        for field in ("serial", "product", "gpu_model"):
            want = expect.get(field)
            if want is None:
                continue
            have = getattr(claims, field)
            if have is None or have.strip().casefold() != str(want).strip().casefold():
                mismatched.append(field)
        want_count = expect.get("gpu_count")
        if want_count is not None and claims.gpu_count != want_count:
            mismatched.append("gpu_count")
        if mismatched:
            raise AccessDeniedError(
                f"the machine's claims do not match what the join token expects: {', '.join(mismatched)}",
                details={"reason": "expect_mismatch", "fields": mismatched},
            )
        return {}


def checked_evidence(evidence: Mapping[str, Any] | None) -> dict[str, str]:
    """``evidence`` as a small mapping of names to text; ``INVALID_INPUT`` for anything else."""
    if evidence is None:
        return {}
    if not isinstance(evidence, Mapping) or len(evidence) > MAX_EVIDENCE:
        raise InvalidInputError(f"evidence: at most {MAX_EVIDENCE} entries of text", details={"path": "evidence"})
    total = 0
    out: dict[str, str] = {}
    for key, value in evidence.items():
        if not isinstance(key, str) or not _TEXT.fullmatch(key) or not isinstance(value, str):
            raise InvalidInputError("evidence: names and values must be text", details={"path": "evidence"})
        total += len(value)
        out[key] = value
    if total > MAX_EVIDENCE_BYTES:
        raise InvalidInputError("evidence: too large", details={"path": "evidence"})
    return out


def chain(attestors: Sequence[Attestor]) -> list[Attestor]:
    """The built-in ``claims`` attestor first, then the host's, in order."""
    return [ClaimsAttestor(), *attestors]
