"""``bcd node`` renews its certificate over the wire, at about two thirds of the certificate's life.

When. At a point drawn between 63 % and 70 % of the life (nodes that joined together do not renew together). The
life is counted from the later of ``notBefore`` and the moment the certificate was written to disk: the CA
backdates ``notBefore`` by a minute for slow clocks, which for a short lifetime would put two thirds before the
certificate even arrived, and the node would renew in a loop.

How. ``RenewChallenge``, then ``Renew``, on a connection made with the current certificate. Every renewal rotates
the key: the proof is the current key's signature over the challenge and a CSR for a new key, and the control plane
renews only a node's newest certificate, so a key the node rotated away from dies with its certificate. The new key
is written first, as ``renewal.key``; a renewal whose answer was lost is asked again with that same key, which the
control plane answers again. The answer lands as ``node.crt``, then ``node.key``, then ``ca-bundle.pem`` and
``node.json``, and ``renewal.key`` goes; a crash between the certificate and the key is finished by ``settle`` when
the daemon next starts (``node.crt`` then holds ``renewal.key``'s public key).

The live session is kept. The gateway checks a certificate when a session opens, the old certificate stays valid
until it expires, and revoking or retiring the node revokes every certificate it holds (closing the session either
way); reconnecting would bump the epoch, publish a closed and an opened session, and could cut a running command,
for nothing. The next connection is made with the new certificate. A session signs its command results with the key
of the certificate it opened with, since that is the key the gateway checks them against.

Failures. A renewal that fails (the gateway unreachable, a refusal) is logged in one line and tried again with
exponential backoff and jitter, never later than a third of the certificate's remaining life. A refusal saying the
identity is gone (revoked, retired, untrusted) ends the loop: the daemon stops as it does on such a ``Close``. A
certificate that expired all the same is not renewed: the session loop re-enrolls at its next connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import random
import ssl
import time
from collections.abc import Callable
from typing import Any

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError, StreamTerminatedError

import bettercompute_proto as wire

from ._state import NodeIdentity, StateDir
from .identity import NodeKey

__all__ = [
    "IDENTITY_GONE",
    "PENDING_KEY",
    "REENROLL_TOKEN",
    "Credentials",
    "IdentityGone",
    "RenewalFailed",
    "Renewer",
    "envelope",
    "retryable",
    "settle",
]

log = logging.getLogger("bcd")

PENDING_KEY = "renewal.key"
"""The key of a renewal under way (kept until its certificate is on disk)."""
REENROLL_TOKEN = "reenroll.token"  # noqa: S105 - a file name, not a secret
"""The join token ``bcd node`` joins again with once its certificate expired (``bcd join --keep-token``)."""
IDENTITY_GONE = frozenset({"revoked", "retired", "certificate_revoked", "node_retired", "untrusted"})
"""Reasons (of a refusal or a ``Close``) that say the node's identity is gone: retrying cannot help."""

RENEW_AT = 2 / 3
JITTER = 1 / 30
FIRST_RETRY = 2.0
LAST_RETRY = 300.0
CALL_TIMEOUT = 30.0
_RETRYABLE = {Status.UNAVAILABLE, Status.DEADLINE_EXCEEDED, Status.INTERNAL, Status.UNKNOWN}


class RenewalFailed(Exception):
    """A renewal did not happen; try again later (the message is one line, with no secret)."""


class IdentityGone(RenewalFailed):
    """The control plane refused the renewal because the node's identity is gone."""


def envelope(error: GRPCError) -> dict[str, Any]:
    """The error envelope a refusal carries (``{}`` when it carries none)."""
    try:
        body = json.loads(error.message or "")["error"]
    except (ValueError, KeyError, TypeError):
        return {}
    return body if isinstance(body, dict) else {}


def retryable(error: GRPCError) -> bool:
    """Whether asking again later may succeed: the envelope says so, or the status is one of a passing failure."""
    return envelope(error).get("retryable") is True or error.status in _RETRYABLE


def _reason(error: GRPCError) -> str | None:
    details = envelope(error).get("details")
    reason = details.get("reason") if isinstance(details, dict) else None
    return reason if isinstance(reason, str) else None


def _describe(error: GRPCError) -> str:
    body = envelope(error)
    if not body:
        return f"{error.status.name}: {error.message or 'no message'}"
    reason = _reason(error)
    return f"{body.get('message')} ({body.get('code')}{', ' + reason if reason else ''})"


def _ec_key(pem: bytes) -> NodeKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("a key in the state directory is not an EC key")
    return NodeKey(key)


def _public(key: NodeKey) -> bytes:
    return key.private_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _certificate_key(certificate: x509.Certificate) -> bytes:
    return certificate.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def settle(state: StateDir) -> bool:
    """Finish a renewal that stopped between writing its certificate and its key (a crash, a full disk): ``node.crt``
    holds the public key of ``renewal.key``, which then becomes ``node.key``; whether it did. Any other
    ``renewal.key`` waits for the next renewal."""
    pending = state.path / PENDING_KEY
    if not pending.exists():
        return False
    key_pem = state.read(PENDING_KEY)
    certificate = x509.load_pem_x509_certificate(state.read("node.crt"))
    if _certificate_key(certificate) != _public(_ec_key(key_pem)):
        return False
    identity = state.identity()
    if identity is not None:
        state.save_identity_record(
            attrs.evolve(
                identity,
                serial=format(certificate.serial_number, "x"),
                not_after_ms=round(certificate.not_valid_after_utc.timestamp() * 1000),
            )
        )
    state.write("node.key", key_pem)
    pending.unlink()
    log.info("finished keeping a renewed certificate: its key is in place")
    return True


@attrs.frozen(kw_only=True)
class Credentials:
    """The node's identity as it is on disk: who it is, its key, when its certificate expires and when to renew it
    (seconds since the epoch)."""

    identity: NodeIdentity
    key: NodeKey
    not_after: float
    renew_at: float

    @classmethod
    def load(cls, state: StateDir) -> Credentials:
        """Read the identity from ``state`` (``settle`` it before).

        Raises:
            ValueError: the state directory holds no identity, or a key or certificate that does not load, or a key
                that is not the certificate's.
        """
        identity = state.identity()
        if identity is None:
            raise ValueError(f"no node identity in {state.path}")
        key = _ec_key(state.read("node.key"))
        certificate = x509.load_pem_x509_certificate(state.read("node.crt"))
        if _certificate_key(certificate) != _public(key):
            raise ValueError("the node key on disk is not the key of the node certificate")
        not_before = certificate.not_valid_before_utc.timestamp()
        not_after = certificate.not_valid_after_utc.timestamp()
        written = min((state.path / "node.crt").stat().st_mtime, time.time())
        start = min(max(not_before, written), not_after)
        share = random.uniform(RENEW_AT - JITTER, RENEW_AT + JITTER)  # noqa: S311 - jitter, not a secret
        return cls(identity=identity, key=key, not_after=not_after, renew_at=start + (not_after - start) * share)

    def expired(self, now: float | None = None) -> bool:
        """Whether the certificate has expired (it cannot be renewed then: the node joins again)."""
        return (time.time() if now is None else now) >= self.not_after

    def expiry(self) -> str:
        """When the certificate expires(d), for a log line."""
        return dt.datetime.fromtimestamp(self.not_after, dt.UTC).isoformat(timespec="seconds")


class Renewer:
    """The renewal loop of ``bcd node`` and the credentials it keeps current (see the module docstring).

    Args:
        state: The state directory.
        connect: A channel to the gateway with the certificate on disk now.
    """

    def __init__(self, state: StateDir, connect: Callable[[], Channel]) -> None:
        self._state = state
        self._connect = connect
        settle(state)
        self.credentials = Credentials.load(state)
        self._changed = asyncio.Event()

    def reload(self) -> None:
        """Take up a new identity written to disk (a re-enrolment): its key, its certificate and when to renew it.
        A half-done renewal of the identity before it is dropped."""
        with contextlib.suppress(FileNotFoundError):
            (self._state.path / PENDING_KEY).unlink()
        self.credentials = Credentials.load(self._state)
        self._changed.set()

    async def run(self) -> str:
        """Renew each certificate at about two thirds of its life, until a refusal says the identity is gone;
        returns that refusal (one line)."""
        backoff = FIRST_RETRY
        while True:
            credentials = self.credentials
            now = time.time()
            if credentials.expired(now):
                await self._pause(None)  # the session loop re-enrolls, then ``reload`` wakes this loop
                continue
            if credentials.renew_at > now:
                await self._pause(credentials.renew_at - now)
                continue
            try:
                await self.renew()
            except IdentityGone as exc:
                return str(exc)
            except RenewalFailed as exc:
                remaining = credentials.not_after - time.time()
                delay = min(backoff, max(FIRST_RETRY, remaining / 3)) * random.uniform(0.8, 1.2)  # noqa: S311
                log.warning("the certificate was not renewed: %s; trying again in %.0f s", exc, delay)
                backoff = min(backoff * 2, LAST_RETRY)
                await self._pause(delay)
            else:
                backoff = FIRST_RETRY

    async def _pause(self, seconds: float | None) -> None:
        """Wait ``seconds`` (forever when ``None``), or until the credentials change."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), seconds)
        self._changed.clear()

    async def renew(self) -> None:
        """Renew the certificate once and keep the answer.

        Raises:
            IdentityGone: the control plane says the identity is gone.
            RenewalFailed: anything else that kept it from happening.
        """
        try:
            if settle(self._state):  # a renewed certificate that could not be kept whole last time
                self.credentials = Credentials.load(self._state)
                return
            new_key = self._pending_key()
            channel = self._connect()
        except (OSError, ValueError, ssl.SSLError) as exc:
            raise RenewalFailed(f"local state unusable: {type(exc).__name__}") from None
        credentials = self.credentials
        csr_pem = new_key.csr_pem(credentials.identity.node_id)
        try:
            stub = wire.NodeStub(channel)
            async with asyncio.timeout(CALL_TIMEOUT):
                challenge = (await stub.renew_challenge(wire.RenewChallengeRequest())).challenge
                signature = credentials.key.renewal_proof(challenge, csr_pem)
                reply = await stub.renew(wire.RenewRequest(challenge=challenge, signature=signature, csr_pem=csr_pem))
        except GRPCError as exc:
            kind = IdentityGone if _reason(exc) in IDENTITY_GONE else RenewalFailed
            raise kind(f"refused: {_describe(exc)}") from None
        except (TimeoutError, OSError, StreamTerminatedError, ssl.SSLError) as exc:
            raise RenewalFailed(f"the gateway could not be reached: {type(exc).__name__}") from None
        finally:
            channel.close()
        try:
            self._keep(credentials, reply.certificate, new_key)
        except OSError as exc:  # the answer is as good as lost: the next try asks again with the same key
            raise RenewalFailed(f"the renewed certificate could not be written: {type(exc).__name__}") from None

    def _pending_key(self) -> NodeKey:
        """The key of the renewal under way: the one kept from an attempt whose answer was lost, or a new one."""
        try:
            return _ec_key(self._state.read(PENDING_KEY))
        except (FileNotFoundError, ValueError, TypeError):
            key = NodeKey()
            self._state.write(PENDING_KEY, key.private_key_pem())
            return key

    def _keep(self, renewed_from: Credentials, certificate: wire.Certificate | None, new_key: NodeKey) -> None:
        """Check the renewed certificate and write it to disk (see the module docstring for the order).

        Raises:
            RenewalFailed: it is not a certificate of this node for the new key, or the node joined again meanwhile.
        """
        if self.credentials is not renewed_from:
            raise RenewalFailed("the node joined again while the renewal was under way; its answer is dropped")
        identity = renewed_from.identity
        if certificate is None or certificate.node_id != identity.node_id:
            raise RenewalFailed("the gateway answered with a certificate of another node")
        try:
            issued = x509.load_pem_x509_certificate(certificate.certificate_pem.encode())
        except ValueError:
            raise RenewalFailed("the gateway answered with something that is not a certificate") from None
        if _certificate_key(issued) != _public(new_key):
            raise RenewalFailed("the gateway answered with a certificate for another key")
        renewed = NodeIdentity(
            node_id=identity.node_id, serial=certificate.serial, not_after_ms=certificate.not_after_ms
        )
        self._state.write("node.crt", (certificate.certificate_pem + certificate.chain_pem).encode())
        self._state.write("node.key", new_key.private_key_pem())
        if certificate.trust_bundle_pem.strip():
            self._state.write("ca-bundle.pem", certificate.trust_bundle_pem.encode())
        self._state.save_identity_record(renewed)
        (self._state.path / PENDING_KEY).unlink()
        self.credentials = Credentials.load(self._state)
        log.info(
            "certificate renewed: serial %s, valid until %s; the next connection uses it",
            renewed.serial,
            self.credentials.expiry(),
        )
