"""``dev``'s simulated node: one machine with 8 fake GPUs, joined through dev's own gateway and held in dev's
process.

It runs in dev's event loop, not as a child process: one node costs nothing there, it stops with dev (Ctrl-C),
nothing is left behind when dev dies, and it still goes over the real wire (its own key and certificate, a real
``Join``, a mutual-TLS session through the gateway on loopback), held by the daemon's own code (``bcd sim``'s
``Simulator``).

First run: as the root admin (with the credential ``bootstrap`` just minted) it makes a pool ``dev`` (or finds it)
and a join token, and the node joins with it. Its state stays in dev's data folder, so a later run reconnects the
same node without a credential or a token. State left by a control plane whose database is gone (the node is not
known here) is dropped and the node joins again, when a credential to do it with was just minted.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import anyio
import attrs
import typer

from bettercompute import BetterCompute
from bettercompute.errors import ComputeError
from bettercompute.modules.nodes import NODES, CreateJoinTokenInput
from bettercompute.modules.pools import CreatePoolInput, ListPoolsInput, Pool
from bettercompute_daemon import DaemonError, SimOptions, Simulator, parse_join_command
from bettercompute_iam import Bootstrap

from ._profiles import DEFAULT_SERVER

__all__ = ["DEV_POOL", "run_dev_node"]

log = logging.getLogger("bettercompute.cli")

DEV_POOL = "dev"
DEV_NODE = SimOptions(nodes=1, seed=0, gpus_per_node=8)
TOKEN_USES = 4
TOKEN_SECONDS = 3600
OPEN_WAIT = 30.0


async def _pool(compute: BetterCompute, credential: str, tenant: str) -> Pool:
    """The root tenant's pool ``dev``, made on first use."""
    cursor: str | None = None
    while True:
        page = await compute.api.pools.list(credential, ListPoolsInput(tenant=tenant, cursor=cursor))
        for pool in page.pools:
            if pool.name == DEV_POOL:
                return pool
        cursor = page.next_cursor
        if cursor is None:
            break
    created: Pool = await compute.api.pools.create(credential, CreatePoolInput(tenant=tenant, name=DEV_POOL))
    log.info("made the pool %s (%s) for dev's simulated node", DEV_POOL, created.id)
    return created


async def _known(compute: BetterCompute, node_id: str) -> bool:
    """Whether ``node_id`` is a live node of this control plane (not one of a database since dropped)."""
    store = compute.options.store
    if store is None:  # dev always has one; without it nothing can be checked
        return True
    record = await store.repository(NODES).get(node_id)
    return record is not None and record.state != "retired"


async def _adopted(compute: BetterCompute, node_id: str) -> None:
    """Wait (at most ``OPEN_WAIT``) until ``node_id`` is adopted: its GPUs can be reserved from then on. Before,
    the reservation dev prints would be refused as NO_CAPACITY (its atoms not yet healthy)."""
    store = compute.options.store
    if store is None:
        return
    with anyio.move_on_after(OPEN_WAIT):
        while (record := await store.repository(NODES).get(node_id)) is None or record.state == "adopting":  # noqa: ASYNC110
            await anyio.sleep(0.2)


async def run_dev_node(
    compute: BetterCompute, bootstrap: Bootstrap, folder: Path, *, api: str, gateway: str | None = None
) -> None:
    """Join (first run) and hold dev's simulated node until cancelled; print what to try next once it is in
    session and adopted. Problems are logged, never raised: dev goes on without its node.

    Args:
        gateway: Where dev's gateway listens (``host:port``), when not where the join command says (``gateway_port``
            set): the node dials it there.
    """
    simulator = Simulator(folder, DEV_NODE)
    try:
        identity = simulator.state(0).identity()
        if identity is not None and not await _known(compute, identity.node_id):
            if bootstrap.credential is None:
                log.warning(
                    "dev's simulated node %s (state in %s) is not a node of this control plane (another database?):"
                    " delete that folder, or run `better-compute dev --rotate` once, for it to join again",
                    identity.node_id,
                    folder,
                )
                return
            log.info("dev's simulated node %s is not known here (another database?): it joins again", identity.node_id)
            shutil.rmtree(simulator.state(0).path)
        if simulator.unjoined():
            if bootstrap.credential is None:
                log.warning(
                    "dev's simulated node has not joined (no state in %s) and the root admin's credential was minted"
                    " earlier, so dev cannot act for it: run `better-compute dev --rotate` once",
                    folder,
                )
                return
            pool = await _pool(compute, bootstrap.credential, bootstrap.tenant_id)
            created = await compute.api.join_tokens.create(
                bootstrap.credential,
                CreateJoinTokenInput(
                    pool_id=pool.id, uses=TOKEN_USES, expires_in_seconds=TOKEN_SECONDS, reclaim="same-hardware"
                ),
            )
            token, config = parse_join_command(created.join_command)
            pinned = config.node_config()
            if gateway is not None:
                pinned = attrs.evolve(pinned, gateway=gateway)
            simulator = Simulator(folder, DEV_NODE, token=token, config=pinned, bundle_pem=config.ca_bundle_pem)
        async with anyio.create_task_group() as tg:
            tg.start_soon(simulator.run)
            with anyio.move_on_after(OPEN_WAIT):
                while not simulator.stats.sessions_opened and not simulator.stats.join_refused:  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            if simulator.stats.join_refused:
                tg.cancel_scope.cancel()
                return
            identity = simulator.state(0).identity()
            pool_id = simulator.state(0).config().pool or "<pool id>"
            if identity is not None:
                await _adopted(compute, identity.node_id)
                typer.echo(_next_steps(identity.node_id, pool_id, bootstrap.tenant_id, api, folder))
    except (ComputeError, DaemonError, OSError, ValueError) as exc:
        message = exc.message if isinstance(exc, ComputeError) else str(exc)
        log.warning("dev's simulated node stopped: %s", message)


def _curl(api: str, path: str, body: str) -> str:
    return (
        f"""curl -X POST -H "Authorization: Bearer $TOKEN" -H 'content-type: application/json' \\\n"""
        f"""        {api}/api/compute/{path} -d '{body}'"""
    )


def _next_steps(node_id: str, pool_id: str, tenant: str, api: str, folder: Path) -> str:
    cli = "better-compute" if api == DEFAULT_SERVER else f"BETTERCOMPUTE_URL={api} better-compute"
    reserve = json.dumps({"tenant": tenant, "pool_id": pool_id, "gpus": 1, "duration": "PT1H"}, separators=(",", ":"))
    lines = [
        "",
        f"A simulated node with 8 fake GPUs is in session: {node_id}, in pool {DEV_POOL} ({pool_id}).",
        f"(It runs inside dev, its state in {folder}; `bcd sim` runs many.)",
        "",
        "Next, with $TOKEN set:",
        "",
        "  Save the server and credential, so that later commands need neither (a profile, readable by you only):",
        f"    {cli} login",
        "",
        "  Watch the nodes (Ctrl-C ends it):",
        f"    {cli} nodes watch --tenant {tenant}",
        "",
        "  Reserve one of its GPUs for an hour, and wait until the node has it (placed at once; bound when the node",
        "  acknowledged the desired state that carries it; active from its start; ended at its end):",
        f"    {cli} reservations create --tenant {tenant} --pool-id {pool_id} --gpus 1 --duration PT1H --wait",
        "",
        "  The pool's calendar, and its reservations:",
        f"    {cli} capacity show --pool-id {pool_id}",
        f"    {cli} reservations list --tenant {tenant} --pool-id {pool_id}",
        "",
        "  Make a join token for a real machine (it prints the `bcd join ...` command to run there):",
        f"    {cli} join-tokens create --pool-id {pool_id} --uses 1 --expires-in-seconds 3600",
        "",
        "  Every command is one API method: POST /api/compute/<group>/<method>. The reservation, over HTTP:",
        f"    {_curl(api, 'reservations/create', reserve)}",
        "",
    ]
    return "\n".join(lines)
