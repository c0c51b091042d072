"""``bcd join`` and ``bcd node``: the daemon dials out to a gateway over gRPC with mutual TLS and never listens.

Join: a fresh key and CSR, the hardware claims, and the one-time token sealed to JoinService's key and bound to
them, sent over TLS that trusts only the pinned CA bundle (no client certificate yet). What comes back is kept in
the state directory.

Node: one ``Session`` stream with the node's certificate. ``Hello``, then the gateway's ``Welcome`` (epoch and
heartbeat interval); heartbeats; inventory sections when asked; desired state recorded, its CDI spec written
(``_cdi``) and acknowledged once all of it was applied; commands
run and their results signed by the node key over the command id, its kind, the outcome, the result and the epoch.
A ``Close`` whose reason says the identity is gone (``revoked``, ``retired``, a refused certificate) stops the
daemon for good (exit status 3: its unit does not restart it), unless only the certificate the session opened with
was revoked and the node has renewed since (it reconnects with the new one); any other end reconnects with
exponential backoff and jitter, so that a gateway restart does not bring every node back in the same second.
Alongside the sessions, the certificate is renewed at about two thirds of its life (``_renewal``).

Tunnels (``docs/tunnels.md``): on ``TunnelOpen`` the daemon checks the target (``127.0.0.1:<port>`` only for a port
of ``tunnel_local_ports``; any other address only when ``tunnel_targets`` says it is an instance this node runs),
connects to it, and opens a ``Tunnel`` stream on the session's own channel (no new connection, nothing listening)
whose first frame names the tunnel; bytes then flow both ways until either side ends. A refused target is answered
on that stream with ``close_reason`` ``target_refused``, one that does not answer with ``target_unreachable``.

VM instances (hosted pools, ``docs/vps-node.md``): with a ``VmHost`` (``bcd node`` whose settings name a
``vm_dir``) the node advertises ``vm``, carries out the ``instances`` section of each desired state in a background
task (a download does not hold up the session), acknowledges the generation once every instance was acted on, and
reports the instances' states with the ``instances.report`` call on the session's channel.

The same ``Agent`` holds each simulated node of ``bcd sim`` (``_sim``): without a CDI directory it writes nothing for
a desired state and acknowledges it (after ``ack_delay``), answers ``diag.nvml`` with the declared health without a
thread, and tells an observer what happened (sessions opened and ended, inventory sent, commands answered, acks);
``drop()`` cuts the live connection as a network fault would, and the node reconnects as ``bcd node`` does.

Re-enrolment: a certificate that expired (the machine was off, or renewals kept failing) cannot be renewed. Before
it dials, ``bcd node`` then joins again as ``bcd join`` does (a new key and CSR, the same hardware claims, the
pinned configuration) with the token kept in ``reenroll.token``; with a token whose ``reclaim`` is
``same-hardware`` the control plane gives the node its id back. Without a token, or when the join is refused (with
the gateway's reason), it stops with exit status 4, which its unit does not restart either: an operator has to act.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
import ssl
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import attrs
import betterproto2
from cryptography import x509
from grpclib.client import Channel
from grpclib.const import Cardinality
from grpclib.exceptions import GRPCError, StreamTerminatedError

import bettercompute_proto as wire

from ._call import call
from ._cdi import DEFAULT_CDI_DIR, apply_desired_state
from ._errors import DaemonError, JoinRefused
from ._instructions import InstructionCheck
from ._inventory import Inventory
from ._renewal import IDENTITY_GONE, REENROLL_TOKEN, Renewer, retryable
from ._state import NodeConfig, NodeIdentity, StateDir
from ._vm import SpecError, VmHost, parse_instances
from .identity import NodeKey, join_binding, seal_token

__all__ = ["EXPIRED", "STOPPED", "Agent", "DaemonError", "JoinRefused", "Observer", "join", "run_node"]

log = logging.getLogger("bcd")

APPLIED_GENERATION = "applied-generation.json"
"""The state file holding the newest desired-state generation the node acted on, and the node id it was for."""

VERSION = "0.1.0"
STOPPED = 3
"""The exit status when the node's identity is gone (revoked, retired): retrying cannot help."""
EXPIRED = 4
"""The exit status when the certificate expired and the node could not join again (no ``reenroll.token``, or the
join was refused): retrying cannot help either, an operator has to act."""

_FINAL = IDENTITY_GONE
_CERTIFICATE_REVOKED = frozenset({"revoked", "certificate_revoked"})
"""Reasons that may concern only the certificate a session opened with (its node may hold a newer one)."""
_TUNNEL_CHUNK = 64 * 1024  # the most data a tunnel frame carries (the gateway refuses more)
_CONNECT_TIMEOUT = 5.0
_LOCAL = "127.0.0.1"
INSTANCE_TARGET = "instance:"
"""How the control plane names an instance as a tunnel's target host: ``instance:<instance id>``."""
_CAPABILITIES = ["inventory", "desired-state", "cdi", "diag.nvml"]

Observer = Callable[[str, Mapping[str, Any]], None]
"""Told of each notable thing a node's sessions do: its name (``session_opened``, ``session_ended``, ``inventory``,
``desired_state``, ``command``, ``ack``, ``tunnel``) and a few JSON-ready facts about it."""


def _unobserved(event: str, facts: Mapping[str, Any]) -> None:
    """No observer."""


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too).

    Raises:
        DaemonError: not an address with a port.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not host or not 0 < int(port) < 65536:
        raise DaemonError(f"the gateway address must be host:port, not {address!r}")
    return host.strip("[]"), int(port)


def _context(bundle_pem: str, *, certificate: tuple[str, str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=bundle_pem)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    if certificate is not None:
        context.load_cert_chain(certfile=certificate[0], keyfile=certificate[1])
    return context


def refusal(error: GRPCError) -> str:
    """One line for a refused call: the envelope's message, code and reason when the gateway sent one."""
    try:
        body = json.loads(error.message or "")["error"]
        reason = body.get("details", {}).get("reason")
        return f"{body['message']} ({body['code']}{', ' + reason if reason else ''})"
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"{error.status.name}: {error.message or 'no message'}"


async def join(
    *, state: StateDir, token: str, config: NodeConfig, bundle_pem: str, inventory: Inventory, pin: bool = True
) -> NodeIdentity:
    """Join the pool with ``token`` and keep the identity in ``state``. ``pin``: keep ``bundle_pem`` as the bundle
    this node was told to trust (``pinned-ca.pem``, the anchor of instruction signers); a re-enrolment, which trusts
    what earlier gateways handed over too, keeps the pin it had.

    Raises:
        DaemonError: the gateway could not be reached or refused the join (with its reason).
    """
    key = NodeKey()
    csr_pem = key.csr_pem(str(inventory.claims.get("hostname", "node")))
    claims = inventory.claims
    sealed = seal_token(config.join_key, token, binding=join_binding(csr_pem, claims, None, config.pool))
    host, port = split_address(config.gateway)
    channel = Channel(host, port, ssl=_context(bundle_pem))
    try:
        reply = await wire.NodeStub(channel).join(
            wire.JoinRequest(
                sealed_token=sealed, csr_pem=csr_pem, claims_json=json.dumps(claims), pool_id=config.pool or ""
            )
        )
    except GRPCError as exc:
        kind = DaemonError if retryable(exc) else JoinRefused
        raise kind(f"the join was refused: {refusal(exc)}") from None
    except (OSError, StreamTerminatedError, ssl.SSLError) as exc:
        raise DaemonError(f"the gateway {config.gateway} could not be reached: {type(exc).__name__}") from None
    finally:
        channel.close()
    certificate = reply.certificate
    if certificate is None or not certificate.spiffe_id.startswith(f"spiffe://{config.trust_domain}/"):
        raise DaemonError("the gateway answered with a certificate of another trust domain")
    identity = NodeIdentity(
        node_id=certificate.node_id, serial=certificate.serial, not_after_ms=certificate.not_after_ms
    )
    state.save_config(config)
    if pin:
        state.write("pinned-ca.pem", bundle_pem.encode())
    state.save_identity(
        identity,
        key_pem=key.private_key_pem(),
        certificate_pem=certificate.certificate_pem + certificate.chain_pem,
        bundle_pem=certificate.trust_bundle_pem,
    )
    return identity


@attrs.define
class _Session:
    stream: Any
    channel: Channel
    key: NodeKey
    """The key of the certificate the session opened with: the gateway checks command results against it."""
    sends: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    epoch: int = 0
    closed: str | None = None

    async def send(self, frame: wire.NodeFrame) -> None:
        async with self.sends:
            await self.stream.send_message(frame)


class Agent:
    """``bcd node``: one session at a time, reconnecting until stopped or told the identity is gone.

    Args:
        state: The node's state directory (joined).
        inventory: What the node reports.
        sleep: How to wait before reconnecting.
        cdi_dir: Where the CDI spec of a desired state is written; ``None`` for a simulated node, which writes
            nothing (not even ``desired.json``) and acknowledges every desired state.
        observer: Told of each notable event (see ``Observer``).
        ack_delay: Seconds between receiving a desired state and acknowledging it (a fault ``bcd sim`` injects).
        tunnel_local_ports: The ports of this machine's own services (on ``127.0.0.1``) a tunnel may reach; none
            by default.
        tunnel_targets: Whether ``(address, port)`` belongs to an instance this node runs (the VM runtime's
            answer); by default no address but the allowed local ports is.
        vms: Runs the desired state's ``instances``; ``None``: this node runs no VMs (a simulated node never does).
    """

    def __init__(
        self,
        state: StateDir,
        inventory: Inventory,
        *,
        sleep: Callable[[float], Any] = asyncio.sleep,
        cdi_dir: Path | None = DEFAULT_CDI_DIR,
        observer: Observer = _unobserved,
        ack_delay: float = 0.0,
        tunnel_local_ports: Collection[int] = (),
        tunnel_targets: Callable[[str, int], bool] | None = None,
        vms: VmHost | None = None,
    ) -> None:
        self._state = state
        self._vms = vms
        self._applying: set[asyncio.Task[None]] = set()
        self._latest_generation = 0
        self._applied: tuple[str, int] | None = None  # (node id, newest generation acted on), read once from state
        self._warned_no_vms = False
        self._inventory = inventory
        self._cdi_dir = cdi_dir
        self._sleep = sleep
        self._observe = observer
        self._ack_delay = ack_delay
        self._session: _Session | None = None
        self._tunnel_local_ports = frozenset(tunnel_local_ports)
        self._tunnel_targets: Callable[[str, int], bool] = tunnel_targets or _no_instance
        self._capabilities = [c for c in _CAPABILITIES if c != "cdi" or cdi_dir is not None]
        if vms is not None:
            self._capabilities.append("vm")
        config = state.config()
        identity = state.identity()
        if identity is None:
            raise DaemonError(f"no node identity in {state.path}: run bcd join first")
        self._config = config
        self._renewer = Renewer(state, self._channel)
        self._instructions = InstructionCheck(self._signer_anchors, trust_domain=config.trust_domain)

    async def run(self) -> int:
        """Hold sessions and renew the certificate until the identity is gone (``STOPPED``) or expired beyond
        re-enrolment (``EXPIRED``)."""
        renewing = asyncio.create_task(self._renew(), name="bcd-renewal")
        holding = asyncio.create_task(self._hold(), name="bcd-sessions")
        vms = asyncio.create_task(self._vms.run(), name="bcd-vms") if self._vms is not None else None
        try:
            done, _ = await asyncio.wait({renewing, holding}, return_when=asyncio.FIRST_COMPLETED)
            return done.pop().result()
        finally:
            tasks = [t for t in (renewing, holding, vms, *self._applying) if t is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _renew(self) -> int:
        refused = await self._renewer.run()
        log.error("the certificate renewal was %s; this node's identity is gone, stopping", refused)
        return STOPPED

    async def _hold(self) -> int:
        """Hold sessions, one at a time; before each, join again if the certificate expired."""
        backoff = 1.0
        while True:
            if self._renewer.credentials.expired():
                status = await self._reenrol()
                if status is not None:
                    return status
            started = time.monotonic()
            opened_with = self._renewer.credentials.identity.serial  # what _one_session dials with (no await between)
            outcome = await self._one_session()
            self._observe("session_ended", {"reason": outcome})
            if outcome in _CERTIFICATE_REVOKED and self._renewer.credentials.identity.serial != opened_with:
                # The certificate the session opened with was revoked, but the node has renewed since (a CA key
                # retired early revokes what it issued): the next session opens with the current one, which the
                # gateway judges on its own. A node whose identity is gone has its current one revoked too.
                log.info("the certificate of the session was revoked; reconnecting with the renewed one")
                await self._sleep(random.uniform(0.5, 1.5))  # noqa: S311 - jitter, not a secret
                continue
            if outcome in _FINAL:
                log.error("the gateway closed the session: %s; this node's identity is gone, stopping", outcome)
                return STOPPED
            if time.monotonic() - started > 60:
                backoff = 1.0
            delay = backoff * random.uniform(0.5, 1.5)  # noqa: S311 - jitter, not a secret
            log.info("session ended (%s); reconnecting in %.1f s", outcome, delay)
            await self._sleep(delay)
            backoff = min(backoff * 2, 60.0)

    def _channel(self) -> Channel:
        """A channel to the gateway with the node's certificate on disk now (for a session or a renewal).

        Raises:
            OSError, ssl.SSLError: the state directory's files do not load.
        """
        host, port = split_address(self._config.gateway)
        files = (str(self._state.path / "node.crt"), str(self._state.path / "node.key"))
        return Channel(host, port, ssl=_context(self._state.gateway_trust(), certificate=files))

    def drop(self) -> bool:
        """Cut the open session's connection, as a network fault would (the node reconnects with backoff); whether
        there was one. A session still opening (no welcome yet) is left alone: cutting those would only measure the
        backoff, which grows with every session that never opened."""
        session = self._session
        if session is None or session.closed is not None or session.epoch == 0:
            return False
        session.closed = "dropped"
        session.channel.close()
        return True

    async def _one_session(self) -> str:
        """One session, from dialing to its end; returns why it ended."""
        credentials = self._renewer.credentials  # read with the files, no await between: a renewal cannot split them
        try:
            channel = self._channel()
        except (OSError, ssl.SSLError) as exc:
            return f"local state unreadable: {type(exc).__name__}"
        try:
            async with channel.request(
                f"/{wire.SERVICE}/Session", Cardinality.STREAM_STREAM, wire.NodeFrame, wire.ControlFrame
            ) as stream:
                session = self._session = _Session(stream=stream, channel=channel, key=credentials.key)
                await stream.send_request()
                hello = wire.Hello(
                    node_id=credentials.identity.node_id,
                    session_nonce=secrets.token_bytes(16),
                    software_version=VERSION,
                    capabilities=self._capabilities,
                )
                await session.send(wire.NodeFrame(hello=hello))
                return await self._serve(session)
        except GRPCError as exc:
            return f"refused: {refusal(exc)}"
        except (TimeoutError, OSError, StreamTerminatedError, ssl.SSLError) as exc:
            dropped = self._session is not None and self._session.closed == "dropped"
            return "dropped" if dropped else f"connection lost: {type(exc).__name__}"
        finally:
            self._session = None
            channel.close()

    async def _serve(self, session: _Session) -> str:
        beats: asyncio.Task[None] | None = None
        acks: set[asyncio.Task[None]] = set()  # and the session's tunnels
        try:
            while True:
                frame = await session.stream.recv_message()
                if frame is None:
                    return session.closed or "the gateway ended the stream"
                kind, content = betterproto2.which_one_of(frame, "frame")
                if isinstance(content, wire.Welcome):
                    session.epoch = content.epoch
                    log.info("session %d open on %s", content.epoch, self._config.gateway)
                    if self._vms is not None:
                        self._vms.set_report(self._reporter(session))
                    self._observe("session_opened", {"epoch": content.epoch})
                    interval = max(content.heartbeat_interval_ms, 100) / 1000
                    beats = asyncio.create_task(self._beat(session, interval))
                elif isinstance(content, wire.InventoryRequest):
                    await self._send_inventory(session, list(content.sections))
                elif isinstance(content, wire.DesiredState):
                    self._observe("desired_state", {"generation": content.generation})
                    # The signature first: a forged generation must not become the newest one applied.
                    if await self._refused_unsigned(session, content):
                        continue
                    if await self._refused_as_older(session, content.generation):
                        continue
                    if self._cdi_dir is not None:
                        self._state.write("desired.json", content.content_json.encode())
                    applied = self._apply(content)
                    applying = self._apply_instances(content)  # whether or not the CDI spec could be written
                    if not applied or applying is False:
                        continue
                    if applying is not True:  # acknowledged once the instances were acted on, in the background
                        task = asyncio.create_task(self._ack_applied(session, content.generation, applying))
                        acks.add(task)
                        task.add_done_callback(acks.discard)
                    elif self._ack_delay > 0:  # later, without holding up the frames that follow
                        task = asyncio.create_task(self._ack(session, content.generation, self._ack_delay))
                        acks.add(task)
                        task.add_done_callback(acks.discard)
                    else:
                        await self._ack(session, content.generation)
                elif isinstance(content, wire.Command):
                    await self._run_command(session, content)
                elif isinstance(content, wire.TunnelOpen):
                    task = asyncio.create_task(self._tunnel(session, content))
                    acks.add(task)
                    task.add_done_callback(acks.discard)
                elif isinstance(content, wire.Close):
                    session.closed = content.reason or "closed"
                    await session.stream.end()  # the gateway then ends the stream with its status
                else:
                    log.warning("ignored a %s frame", kind)
        finally:
            if self._vms is not None:
                self._vms.set_report(None)
            for task in [t for t in (beats, *acks) if t is not None]:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _tunnel_target(self, host: str, port: int) -> tuple[str, int] | None:
        """Where a tunnel connects, or ``None`` when its target is not one this node serves: a local port it
        allows, a port an instance it runs exposes (``instance:<id>``, resolved by the VM host, which knows the
        instance's address or, with user networking, its forwarded port), or what ``tunnel_targets`` accepts."""
        if not 0 < port < 65536:
            return None
        if host == _LOCAL:
            return (host, port) if port in self._tunnel_local_ports else None
        if host.startswith(INSTANCE_TARGET):
            if self._vms is None:
                return None
            return self._vms.tunnel_endpoint(host[len(INSTANCE_TARGET) :], port)
        try:
            return (host, port) if self._tunnel_targets(host, port) else None
        except Exception:
            return None

    async def _tunnel(self, session: _Session, opening: wire.TunnelOpen) -> None:
        """Carry one tunnel: connect to its target and open its stream on the session's channel."""
        tunnel_id = opening.tunnel_id
        reason = "target_refused"
        connected: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        target = self._tunnel_target(opening.host, opening.port)
        if target is not None:
            try:
                async with asyncio.timeout(_CONNECT_TIMEOUT):
                    connected = await asyncio.open_connection(*target)
            except (OSError, TimeoutError):
                reason = "target_unreachable"
        log.info("tunnel %s to %s:%d: %s", tunnel_id, opening.host, opening.port, "connected" if connected else reason)
        self._observe("tunnel", {"tunnel_id": tunnel_id, "outcome": "connected" if connected else reason})
        try:
            async with session.channel.request(
                f"/{wire.SERVICE}/Tunnel", Cardinality.STREAM_STREAM, wire.TunnelFrame, wire.TunnelFrame
            ) as stream:
                await stream.send_request()
                if connected is None:
                    await stream.send_message(wire.TunnelFrame(tunnel_id=tunnel_id, close_reason=reason))
                    await stream.end()
                    while await stream.recv_message() is not None:
                        pass
                    return
                await stream.send_message(wire.TunnelFrame(tunnel_id=tunnel_id))
                await _carry(stream, *connected)
        except (GRPCError, OSError, StreamTerminatedError, ssl.SSLError) as exc:
            log.info("tunnel %s ended: %s", tunnel_id, type(exc).__name__)
        except Exception as exc:  # the session goes on whatever one tunnel does (HTTP/2 out of streams, ...)
            log.warning("tunnel %s failed: %s", tunnel_id, type(exc).__name__)
        finally:
            if connected is not None:
                connected[1].close()

    async def _ack(self, session: _Session, generation: int, delay: float = 0.0) -> None:
        message = wire.desired_ack_message(generation=generation, epoch=session.epoch)
        ack = wire.DesiredStateAck(
            observed_generation=generation, epoch=session.epoch, signature=session.key.sign(message)
        )
        frame = wire.NodeFrame(desired_state_ack=ack)
        if delay:
            await asyncio.sleep(delay)
            try:
                await session.send(frame)
            except Exception:  # the session ended meanwhile: the next one is sent the desired state again
                return
        else:
            await session.send(frame)
        self._observe("ack", {"generation": generation})

    def _signer_anchors(self) -> bytes:
        """The CA certificates an instruction's signer certificate must be issued by: the bundle this node was told
        to trust when it joined (checked against the token's pin), never one a gateway handed over since (a renewal's
        answer passes through a gateway). A state directory without it trusts no signer: join again."""
        return self._state.read("pinned-ca.pem")

    async def _refused_unsigned(self, session: _Session, desired: wire.DesiredState) -> bool:
        """Whether ``desired`` is refused because the control plane did not sign it for this node (logged and
        reported as a ``desired_state.refused`` event with the reason)."""
        node_id = self._renewer.credentials.identity.node_id
        reason = self._instructions.desired_state(node_id, desired)
        if reason is None:
            return False
        log.error("desired state %d refused: %s", desired.generation, reason)
        self._observe("desired_state_refused", {"generation": desired.generation, "reason": reason})
        await self._report(session, "desired_state.refused", {"generation": desired.generation, "reason": reason})
        return True

    async def _report(self, session: _Session, type: str, payload: dict[str, object]) -> None:
        event = wire.NodeEvent(type=type, payload_json=json.dumps(payload), at_ms=round(time.time() * 1000))
        with contextlib.suppress(Exception):  # the session may have ended: the refusal stands, the report is lost
            await session.send(wire.NodeFrame(event=event))

    async def _refused_as_older(self, session: _Session, generation: int) -> bool:
        """Whether ``generation`` is older than one this node already acted on (kept in the state directory, per
        node id, so a restart does not forget it): such a desired state is not applied, whoever sends it, and the
        refusal is logged and reported as a ``desired_state.refused`` event. The same generation again (a new
        session is sent the current one) is acted on again; only an older one is refused."""
        node_id = self._renewer.credentials.identity.node_id
        if self._applied is None or self._applied[0] != node_id:
            self._applied = (node_id, self._applied_generation(node_id))
        applied = self._applied[1]
        if generation >= applied:
            if generation > applied:
                self._applied = (node_id, generation)
                self._state.write(
                    APPLIED_GENERATION, json.dumps({"node_id": node_id, "generation": generation}).encode()
                )
            return False
        log.error("desired state %d refused: generation %d was already applied", generation, applied)
        self._observe("desired_state_refused", {"generation": generation, "applied": applied})
        payload = {"generation": generation, "applied_generation": applied, "reason": "older"}
        await self._report(session, "desired_state.refused", payload)
        return True

    def _applied_generation(self, node_id: str) -> int:
        """The newest desired-state generation this node acted on, as kept in the state directory, or 0 (none,
        another node's, or unreadable)."""
        try:
            kept = json.loads(self._state.read(APPLIED_GENERATION))
        except (OSError, ValueError):
            return 0
        if not isinstance(kept, dict) or kept.get("node_id") != node_id:
            return 0  # a re-enrolled node under a new id starts its generations again
        generation = kept.get("generation")
        return generation if isinstance(generation, int) and not isinstance(generation, bool) else 0

    def _apply_instances(self, desired: wire.DesiredState) -> bool | asyncio.Task[None]:
        """Start carrying out the desired state's ``instances``: the task doing it, or ``True`` when there is
        nothing to wait for (this node runs no VMs), or ``False`` when the section cannot be read (then the desired
        state is not acknowledged)."""
        if self._vms is None and '"instances"' not in desired.content_json:
            return True  # the common case, and every simulated node's: nothing to read
        try:
            content = json.loads(desired.content_json or "{}")
            specs, invalid = parse_instances(content if isinstance(content, dict) else {})
        except (ValueError, SpecError) as exc:
            if self._vms is None:
                return True
            log.error("desired state %d not acknowledged: its instances cannot be read: %s", desired.generation, exc)
            return False
        if self._vms is None:
            if (specs or invalid) and not self._warned_no_vms:
                self._warned_no_vms = True
                log.warning("the desired state lists instances, but this node runs no VMs (no vm_dir configured)")
            return True
        self._latest_generation = max(self._latest_generation, desired.generation)
        task = asyncio.create_task(self._vms.apply(specs, invalid), name=f"bcd-instances-{desired.generation}")
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)
        return task

    async def _ack_applied(self, session: _Session, generation: int, applying: asyncio.Task[None]) -> None:
        """Acknowledge ``generation`` once its instances were acted on, unless a newer desired state came meanwhile
        (its own acknowledgement covers this one). The work goes on when the session ends: the shield keeps it."""
        await asyncio.shield(applying)
        if generation < self._latest_generation or session.closed is not None:
            return
        with contextlib.suppress(Exception):  # the session ended meanwhile: the next one gets the desired state again
            await self._ack(session, generation, delay=self._ack_delay)

    def _reporter(self, session: _Session) -> Callable[[Mapping[str, Any]], Any]:
        async def report(payload: Mapping[str, Any]) -> None:
            await call(session.channel, "instances.report", payload, wait=10.0)

        return report

    def _apply(self, desired: wire.DesiredState) -> bool:
        """Write the CDI spec of a desired state; whether all of it was applied (only then is it acknowledged). A
        simulated node (no CDI directory) has nothing to write."""
        if self._cdi_dir is None:
            return True
        gpus = self._inventory.sections.get("gpus")
        problems = apply_desired_state(
            self._cdi_dir,
            desired.content_json,
            gpus if isinstance(gpus, list) else [],
            generation=desired.generation,
        )
        for problem in problems:
            log.error("desired state %d: %s", desired.generation, problem)
        if problems:
            log.error("desired state %d not acknowledged: not all of it was applied", desired.generation)
        return not problems

    async def _beat(self, session: _Session, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            with contextlib.suppress(Exception):
                await session.send(wire.NodeFrame(heartbeat=wire.Heartbeat(sent_at_ms=round(time.time() * 1000))))

    async def _send_inventory(self, session: _Session, wanted: list[str]) -> None:
        sent = []
        for name, content in self._inventory.sections.items():
            if wanted and name not in wanted:
                continue
            body, fake = json.dumps(content), self._inventory.fake
            message = wire.inventory_section_message(section=name, content_json=body, fake=fake, epoch=session.epoch)
            section = wire.InventorySection(
                section=name,
                content_json=body,
                fake=fake,
                epoch=session.epoch,
                signature=session.key.sign(message),
            )
            await session.send(wire.NodeFrame(inventory=section))
            sent.append(name)
        self._observe("inventory", {"sections": sent})

    async def _run_command(self, session: _Session, command: wire.Command) -> None:
        refusal = self._instructions.command(self._renewer.credentials.identity.node_id, command)
        result: dict[str, Any]
        if refusal is not None:
            # Not run. The refusal is reported, and answered as a failure the node signs (a command the control plane
            # made but a gateway altered then fails at once instead of waiting for its deadline).
            log.error("command %s (%s) refused: %s", command.id, command.kind, refusal)
            self._observe("command_refused", {"kind": command.kind, "reason": refusal})
            await self._report(session, "command.refused", {"command_id": command.id, "reason": refusal})
            outcome, result = "failed", {"reason": "refused", "refusal": refusal}
        elif command.kind == "diag.nvml":
            if self._inventory.nvml is not None:
                health = await asyncio.to_thread(self._inventory.current_health)  # NVML's calls block
            else:
                health = self._inventory.current_health()  # declared: nothing blocks, no thread per node
            outcome, result = "succeeded", {"health": health, "fake": self._inventory.fake}
        else:
            outcome, result = "failed", {"reason": "unknown_kind"}
        body = json.dumps(result, sort_keys=True)
        message = wire.command_result_message(
            command_id=command.id, kind=command.kind, outcome=outcome, result_json=body, epoch=session.epoch
        )
        signed = wire.CommandResult(
            command_id=command.id,
            kind=command.kind,
            outcome=outcome,
            result_json=body,
            epoch=session.epoch,
            signature=session.key.sign(message),
        )
        await session.send(wire.NodeFrame(command_result=signed))
        self._observe("command", {"kind": command.kind, "outcome": outcome})

    async def _reenrol(self) -> int | None:
        """Join again with the kept token, the certificate having expired: ``None`` once joined (and the new
        identity taken up), else the exit status. A gateway that cannot be reached is tried again with backoff."""
        credentials = self._renewer.credentials
        try:
            token = self._state.read(REENROLL_TOKEN).decode().strip()
        except FileNotFoundError:
            token = ""
        if not token:
            log.error(
                "the certificate of node %s expired at %s and no re-enrolment token is kept in %s: run bcd join again"
                " (or place a token whose reclaim is same-hardware there), then bcd node",
                credentials.identity.node_id,
                credentials.expiry(),
                self._state.path / REENROLL_TOKEN,
            )
            return EXPIRED
        log.info(
            "the certificate expired at %s; joining again to get node %s back",
            credentials.expiry(),
            credentials.identity.node_id,
        )
        backoff = 1.0
        while True:
            try:
                bundle = self._state.gateway_trust()
                identity = await join(
                    state=self._state,
                    token=token,
                    config=self._config,
                    bundle_pem=bundle,
                    inventory=self._inventory,
                    pin=False,  # the bundle here includes what gateways handed over since: never an anchor
                )
                break
            except JoinRefused as exc:
                log.error("could not re-enrol node %s: %s", credentials.identity.node_id, exc)
                return EXPIRED
            except DaemonError as exc:
                delay = backoff * random.uniform(0.5, 1.5)  # noqa: S311 - jitter, not a secret
                log.warning("could not re-enrol yet: %s; trying again in %.1f s", exc, delay)
                await self._sleep(delay)
                backoff = min(backoff * 2, 60.0)
        self._renewer.reload()
        if identity.node_id == credentials.identity.node_id:
            log.info("re-enrolled: node %s is back (reclaimed), serial %s", identity.node_id, identity.serial)
        else:
            log.warning(
                "re-enrolled as a new node %s: node %s was not reclaimed (a token whose reclaim is not same-hardware,"
                " or a node retired meanwhile)",
                identity.node_id,
                credentials.identity.node_id,
            )
        return None


def _no_instance(host: str, port: int) -> bool:
    """No address is an instance's (until a VM runtime says otherwise)."""
    return False


async def _carry(stream: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes both ways between a tunnel stream and its TCP connection until either ends; then the other is told."""

    async def outward() -> None:  # the target -> the gateway
        while data := await reader.read(_TUNNEL_CHUNK):
            await stream.send_message(wire.TunnelFrame(data=data))
        await stream.send_message(wire.TunnelFrame(close_reason="target_closed"))
        await stream.end()

    async def inward() -> None:  # the gateway -> the target
        while (frame := await stream.recv_message()) is not None and not frame.close_reason:
            if frame.data:
                writer.write(frame.data)
                await writer.drain()  # a target that does not read holds the gateway back, not memory

    sending = asyncio.create_task(outward())
    receiving = asyncio.create_task(inward())
    try:
        done, _ = await asyncio.wait({sending, receiving}, return_when=asyncio.FIRST_COMPLETED)
        if receiving in done:  # the gateway closed the tunnel: end our side so that its stream ends cleanly
            sending.cancel()
            with contextlib.suppress(Exception):
                await stream.end()
        else:
            with contextlib.suppress(Exception):  # wait for the gateway to end its side (or give up)
                async with asyncio.timeout(2.0):
                    await receiving
        for task in (sending, receiving):
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a broken connection is an end like any other
    finally:
        for task in (sending, receiving):
            task.cancel()
        await asyncio.gather(sending, receiving, return_exceptions=True)


async def run_node(
    state: StateDir,
    inventory: Inventory,
    *,
    cdi_dir: Path = DEFAULT_CDI_DIR,
    vms: VmHost | None = None,
    tunnel_local_ports: Collection[int] = (),
) -> int:
    """``bcd node``: the exit status."""
    return await Agent(state, inventory, cdi_dir=cdi_dir, vms=vms, tunnel_local_ports=tunnel_local_ports).run()


def certificate_not_after(pem: bytes) -> float:
    """When a certificate on disk expires (seconds since the epoch)."""
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
