"""One deployment's settings, and the control plane each of its processes is made of."""

from __future__ import annotations

from pathlib import Path

import attrs

from bettercompute import BetterCompute, JoinSettings, LocalKeyKms, Options, better_compute
from bettercompute.errors import InvalidConfigError
from bettercompute_iam import EmbeddedIam, RemoteIam
from bettercompute_store_pg import PgNotifier, PgStore

__all__ = ["Deployment", "Parts", "central", "compose", "edge"]


@attrs.frozen(kw_only=True)
class Deployment:
    """What every process of the deployment shares. Each process is composed from all of it, as one configuration
    file would be handed to every machine.

    Args:
        database_url: The one PostgreSQL every process uses (it may carry a password: never printed).
        schema: The schema holding every table, the central IAM's included.
        kms_key_file: The key sealing webhook secrets and the node CA's keys; every process reads the same file.
        trust_domain: The SPIFFE trust domain of node certificates.
        gateway_address: ``host:port`` that daemons dial; pinned into every join command.
        iam_url: Where the central IAM process serves (``http://iam.internal:3000``); needed by every process but the
            central one.
        iam_credential: The service account credential those processes present to the central IAM.
    """

    database_url: str = attrs.field(repr=False)
    schema: str = "bettercompute"
    kms_key_file: Path
    trust_domain: str
    gateway_address: str
    iam_url: str | None = None
    iam_credential: str | None = attrs.field(default=None, repr=False)


@attrs.frozen(kw_only=True)
class Parts:
    """A composed control plane, and what it does not own: its process closes them after it."""

    compute: BetterCompute
    store: PgStore
    notifier: PgNotifier
    iam: EmbeddedIam | RemoteIam

    async def close(self) -> None:
        """Close the control plane (stopping its worker roles), then the notifier and the central IAM's client."""
        try:
            await self.compute.close()
        finally:
            await self.notifier.close()
            if isinstance(self.iam, RemoteIam):
                await self.iam.aclose()


def compose(deployment: Deployment, iam: EmbeddedIam | RemoteIam) -> Parts:
    """The control plane of one process, with ``iam``. Nothing but the IAM differs between processes: the store,
    the key, node identity and the notifier are the same everywhere, so every process works on the same state. No
    I/O happens here.

    Raises:
        InvalidConfigError: A setting is malformed (every problem listed).
    """
    store = PgStore(deployment.database_url, schema=deployment.schema)
    notifier = PgNotifier(deployment.database_url, schema=deployment.schema)
    options = Options(
        store=store,
        iam=iam,
        kms=LocalKeyKms(deployment.kms_key_file),
        join=JoinSettings(gateway_address=deployment.gateway_address, trust_domain=deployment.trust_domain),
        # A commit in one process (a join token made by the api, a node reporting through the gateway) pokes the
        # worker's loops over LISTEN/NOTIFY at once, instead of leaving the work to their next poll.
        notifier=notifier,
    )
    return Parts(compute=better_compute(options), store=store, notifier=notifier, iam=iam)


def central(deployment: Deployment) -> Parts:
    """The central IAM process's control plane, the only one that embeds IAM (its tables, methods and jobs)."""
    return compose(deployment, EmbeddedIam())


def edge(deployment: Deployment) -> Parts:
    """The control plane of every other process (api, worker, gateway): IAM is the central one, asked over HTTP.

    The worker and the gateway serve no methods, so they never ask it; they are composed like the api all the same,
    so that no process but the central one carries IAM's tables, methods or jobs.

    Raises:
        InvalidConfigError: ``iam_url`` or ``iam_credential`` is missing, or a setting is malformed.
    """
    if deployment.iam_url is None or deployment.iam_credential is None:
        raise InvalidConfigError(
            "this process asks the central IAM: give its URL and this process's credential",
            details={"problems": ["iam_url and iam_credential are both needed"]},
        )
    return compose(deployment, RemoteIam(deployment.iam_url, deployment.iam_credential))
