"""``bcd site join`` and the site's boot sync (``docs/metal-wire.md``): the control plane side of a site's boot server.

Join. ``bcd site join --token bcst_... --gateway host:port --ca-pin sha256:...`` (or ``--ca-bundle``): a fresh key
and CSR sent to ``site.join`` over TLS that trusts only the pinned CA bundle, without a client certificate. What
comes back is kept in the ``site`` folder of the state directory, as ``bcd join`` keeps a node's (``StateDir``:
mode 0600 in a 0700 folder, each file written whole and renamed):

- ``site.key``: the site's private key; ``site.crt``: its certificate (role ``site``) and the chain;
- ``ca-bundle.pem``: the trust bundle the join answered; ``pinned-ca.pem``: the bundle it was told to trust;
- ``site.json``: the site id, its tenant, the gateway, and when the certificate expires.

Sync. ``SiteSync`` calls ``site.sync`` over mutual TLS with that certificate, as one boot-server process
(``agent``, random for each process unless given): it sends the boot records heard since the last call and gets
back whether this process holds the site's boot lease, and the boot plan to serve. The glue of ``bcd site run`` is
meant to be this loop (the boot server being ``_site.BootServer``)::

    async with SiteSync(state_dir) as sync:
        while True:
            records, pending = pending[:MAX_RECORDS], pending[MAX_RECORDS:]
            try:
                answer = await sync.sync(server.http_base, records)
            except CallError as exc if not exc.retryable: ... stop
            except DaemonError: keep records, wait, try again
            if answer.active: server.set_plan(BootPlan.from_json(answer.plan_json)); serve
            else: stop serving (a standby serves nothing; its records are dropped)
            await asyncio.sleep(answer.sync_after_ms / 1000)

The certificate is not renewed yet: a site is joined again when it expires.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import attrs
from grpclib.client import Channel

from ._agent import split_address
from ._call import CALL_TIMEOUT, call, certificate_for, client_context
from ._errors import DaemonError
from ._state import StateDir
from .identity import NodeKey

__all__ = ["MAX_RECORDS", "SITE_FOLDER", "SiteIdentity", "SiteSync", "SyncAnswer", "site_join", "site_state"]

SITE_FOLDER = "site"
MAX_RECORDS = 500
"""Boot records one ``site.sync`` call may carry."""
_TOKEN = re.compile(r"bcst_[\x21-\x7e]{1,500}")


def site_state(state_dir: Path) -> StateDir:
    """The site's folder of a state directory."""
    return StateDir(state_dir / SITE_FOLDER)


@attrs.frozen(kw_only=True)
class SiteIdentity:
    """The site this state directory holds, once joined."""

    site_id: str
    tenant: str
    gateway: str
    not_after_ms: int


def check_site_token(token: str) -> str:
    """``token`` when it looks like a site token.

    Raises:
        DaemonError: it does not (nothing of it is shown).
    """
    if not _TOKEN.fullmatch(token):
        raise DaemonError("not a site token (bcst_<id>.<secret>, printable ASCII)")
    return token


async def site_join(
    *, state_dir: Path, token: str, gateway: str, bundle_pem: str, wait: float = CALL_TIMEOUT
) -> SiteIdentity:
    """Join a site with ``token`` and keep its identity in ``state_dir``'s ``site`` folder.

    Raises:
        CallError: the control plane refused the join.
        GatewayUnreachable: the gateway did not answer.
        DaemonError: the token is not a site token, or the answer is not a site certificate for the key sent.
    """
    check_site_token(token)
    host, port = split_address(gateway)
    key = NodeKey()
    channel = Channel(host, port, ssl=client_context(bundle_pem))
    try:
        answer = await call(channel, "site.join", {"token": token, "csr_pem": key.csr_pem("site")}, wait=wait)
    finally:
        channel.close()
    site_id, tenant, certificate, chain, trust, not_after_ms = (
        answer.get(name)
        for name in ("site_id", "tenant", "certificate_pem", "chain_pem", "trust_bundle_pem", "not_after_ms")
    )
    if not (
        isinstance(site_id, str)
        and site_id
        and isinstance(tenant, str)
        and isinstance(certificate, str)
        and isinstance(chain, str)
        and isinstance(trust, str)
        and isinstance(not_after_ms, int)
        and not isinstance(not_after_ms, bool)
    ):
        raise DaemonError("site.join answered without a site id, a tenant, a certificate or a trust bundle")
    certificate_for(certificate, key, f"/site/{site_id}")
    identity = SiteIdentity(site_id=site_id, tenant=tenant, gateway=gateway, not_after_ms=not_after_ms)
    state = site_state(state_dir)
    state.write("pinned-ca.pem", bundle_pem.encode())
    state.write("site.key", key.private_key_pem())  # the key first: a certificate on disk always has its key
    state.write("site.crt", (certificate.rstrip("\n") + "\n" + chain).encode())
    state.write("ca-bundle.pem", trust.encode())
    state.write("site.json", json.dumps(attrs.asdict(identity), indent=2).encode())
    return identity


def load_site(state_dir: Path) -> SiteIdentity:
    """The site ``state_dir`` holds.

    Raises:
        DaemonError: it holds none (``bcd site join`` first), or its record does not read.
    """
    state = site_state(state_dir)
    try:
        record = json.loads(state.read("site.json"))
        return SiteIdentity(**record)
    except FileNotFoundError:
        raise DaemonError(f"no site identity in {state.path}: run bcd site join first") from None
    except (OSError, ValueError, TypeError):
        raise DaemonError(f"the site record in {state.path} cannot be read") from None


@attrs.frozen(kw_only=True)
class SyncAnswer:
    """What ``site.sync`` answered."""

    active: bool
    """Whether this process holds the site's boot lease (and so serves the plan)."""
    holder: str
    """The agent holding the lease."""
    plan_json: str
    """The boot plan (``{"generation", "entries"}``) as canonical JSON; an empty plan for a standby."""
    sync_after_ms: int
    """When to call again."""
    lease_ttl_ms: int
    """How long the lease outlives its last renewal."""

    def plan(self) -> dict[str, Any]:
        """The boot plan, parsed."""
        value: dict[str, Any] = json.loads(self.plan_json)
        return value


def _answer(output: Mapping[str, Any]) -> SyncAnswer:
    active, holder, plan = output.get("active"), output.get("holder"), output.get("plan")
    sync_after, ttl = output.get("sync_after_ms"), output.get("lease_ttl_ms")
    whole = [v for v in (sync_after, ttl) if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    if not isinstance(active, bool) or not isinstance(holder, str) or not isinstance(plan, dict) or len(whole) != 2:
        raise DaemonError("site.sync answered without active, holder, plan, sync_after_ms or lease_ttl_ms")
    return SyncAnswer(
        active=active,
        holder=holder,
        plan_json=json.dumps(plan, sort_keys=True, separators=(",", ":")),
        sync_after_ms=whole[0],
        lease_ttl_ms=whole[1],
    )


class SiteSync:
    """``site.sync`` for one boot-server process, over one mutual-TLS connection (made when first needed, made
    again after ``close``).

    Args:
        state_dir: The state directory ``bcd site join`` wrote.
        agent: This process's id for the boot lease; random when not given (a restart is a new agent).
        wait: Seconds a call may take.

    Raises:
        DaemonError: the state directory holds no site.
    """

    def __init__(self, state_dir: Path, agent: str | None = None, *, wait: float = CALL_TIMEOUT) -> None:
        self.state = site_state(state_dir)
        self.identity = load_site(state_dir)
        self.agent = agent or f"agent_{secrets.token_hex(8)}"
        self._wait = wait
        self._channel: Channel | None = None

    def __repr__(self) -> str:
        return f"SiteSync({self.identity.site_id!r}, agent={self.agent!r})"

    async def __aenter__(self) -> SiteSync:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (the next ``sync`` opens another, with the files as they are then)."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _connect(self) -> Channel:
        if self._channel is None:
            trust = self.state.read("ca-bundle.pem").decode() + "\n" + self.state.read("pinned-ca.pem").decode()
            context = client_context(
                trust,
                certificate_pem=self.state.read("site.crt").decode(),
                key_pem=self.state.read("site.key"),
            )
            host, port = split_address(self.identity.gateway)
            self._channel = Channel(host, port, ssl=context)
        return self._channel

    async def sync(self, http_base: str, records: Sequence[Mapping[str, Any]]) -> SyncAnswer:
        """Send the boot records heard since the last call (at most ``MAX_RECORDS``), renew or take the boot lease,
        and get the plan.

        Raises:
            ValueError: more than ``MAX_RECORDS`` records.
            CallError: the control plane refused (``retryable`` says whether to ask again).
            GatewayUnreachable: no answer came (the records were perhaps not taken: send them again).
            DaemonError: the answer cannot be read.
            OSError, ssl.SSLError: the site's files do not load.
        """
        if len(records) > MAX_RECORDS:
            raise ValueError(f"at most {MAX_RECORDS} boot records a call, not {len(records)}")
        request = {"agent": self.agent, "http_base": http_base, "records": [dict(r) for r in records]}
        return _answer(await call(self._connect(), "site.sync", request, wait=self._wait))
