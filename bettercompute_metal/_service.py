"""The ``sites``, ``site-tokens`` and ``metal`` groups' logic.

Sites and machines are projected in the transaction that creates them (a site and a machine with their
pool), so a decision on one follows its tenant and pool. Methods that name only a site or a machine are decided on
its projection row.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import shlex
from typing import Any

from bettercompute import CallContext, JoinSettings, method
from bettercompute.errors import (
    ConflictError,
    FailedPreconditionError,
    InvalidInputError,
    NotFoundError,
)
from bettercompute.modules.images import IMAGES
from bettercompute.modules.nodes import CERTIFICATES, trust_bundle_pem_of
from bettercompute.modules.pools import POOLS
from bettercompute.paging import Keyset
from bettercompute.ports import WORKFLOWS, Kms, ResourceRef
from bettercompute_metal._port import METAL, MachineRecord, SiteRecord
from bettercompute_metal._redfish_json import RedfishError
from bettercompute_metal._redfish_trust import parse_bmc_url
from bettercompute_metal._schemas import (
    Bmc,
    CreatedSiteToken,
    CreateSiteInput,
    CreateSiteTokenInput,
    DeployInput,
    EnrollInput,
    GetSiteInput,
    ListMachinesInput,
    ListMachinesOutput,
    ListSitesInput,
    ListSitesOutput,
    Machine,
    MachineInput,
    PowerInput,
    PowerOutput,
    Site,
)
from bettercompute_metal._tokens import SITE_TOKEN_PREFIX, bundle_pin, credentials_context, new_token
from bettercompute_metal._workflows import COMMISSION, DEPLOY, INSPECT, RELEASE, bmc_client, bmc_error, by_name, start

BOOT_RECORDS_SHOWN = 20
SITE = "site"
MACHINE = "machine"


def require_kms(kms: Kms | None) -> Kms:
    if kms is None:
        raise FailedPreconditionError("bare metal needs a KMS (Options.kms) to seal BMC credentials")
    return kms


# --- views ------------------------------------------------------------------------------------------------------


def site_view(record: SiteRecord) -> Site:
    return Site(
        id=record.id,
        tenant=record.tenant,
        pool_id=record.pool_id,
        name=record.name,
        ramdisk_kernel=record.ramdisk_kernel,
        ramdisk_initrd=record.ramdisk_initrd,
        boot_holder=record.boot_holder,
        boot_lease_expires_at=record.boot_expires_at,
        created_at=record.created_at,
    )


def machine_view(record: MachineRecord, boot_records: tuple[dict[str, Any], ...] = ()) -> Machine:
    state: Any = record.state
    tls: Any = "ca" if record.bmc_tls.get("ca_pem") else "pin"
    return Machine(
        id=record.id,
        tenant=record.tenant,
        pool_id=record.pool_id,
        site_id=record.site_id,
        name=record.name,
        node_id=record.node_id,
        state=state,
        step=record.step,
        reason=record.reason,
        message=record.message,
        workflow_id=record.workflow_id,
        bmc=Bmc(url=record.bmc_url, username=record.bmc_username, tls=tls, credentials_ref=f"bmc/{record.id}"),
        system_uuid=record.system_uuid,
        serial=record.serial,
        macs=record.macs,
        power_state=record.power_state,
        hardware=dict(record.hardware),
        results=dict(record.results),
        image_id=record.image_id,
        disk=record.disk,
        boot_records=boot_records,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


# --- resources --------------------------------------------------------------------------------------------------


def _in_tenant(input: Any) -> ResourceRef:
    return ResourceRef(type=SITE, tenant=input.tenant)


def _on_site(input: Any) -> ResourceRef:
    return ResourceRef(type=SITE, id=getattr(input, "site_id", None) or input.id)


def _on_machine(input: Any) -> ResourceRef:
    return ResourceRef(type=MACHINE, id=input.id)


async def existing_site(call: CallContext, site_id: str) -> SiteRecord:
    record = await call.context.store.repository(METAL).get_site(site_id)
    if record is None:
        raise NotFoundError("no such site", details={"id": site_id})
    return record


async def existing_machine(call: CallContext, machine_id: str) -> MachineRecord:
    record = await call.context.store.repository(METAL).get_machine(machine_id)
    if record is None:
        raise NotFoundError("no such machine", details={"id": machine_id})
    return record


_SITE_PAGES: Keyset[Site] = Keyset(dt.datetime, str, key=lambda s: (s.created_at, s.id))
_MACHINE_PAGES: Keyset[Machine] = Keyset(dt.datetime, str, key=lambda m: (m.created_at, m.id))


# --- sites ------------------------------------------------------------------------------------------------------


async def _image_of_kind(call: CallContext, image_id: str | None, kind: str, tenant: str, field: str) -> None:
    if image_id is None:
        return
    image = await call.context.store.repository(IMAGES).get(image_id)
    if image is None or image.tenant != tenant:
        raise NotFoundError("no such image in this tenant", details={"path": field})
    if image.kind != kind:
        raise InvalidInputError(f"{field}: the image is a {image.kind}, not a {kind}", details={"path": field})


@method(mutates=True, resource=_in_tenant)
async def create_site(call: CallContext, input: CreateSiteInput) -> Site:
    """Create a site in a tenant, for one of its pools.

    Raises:
        NotFoundError: there is no such pool in the tenant, or no such image.
        InvalidInputError: a ramdisk image of the wrong kind.
        ConflictError: the tenant has a site of that name.
    """
    pool = await call.context.store.repository(POOLS).get(input.pool_id)
    if pool is None or pool.tenant != input.tenant:
        raise NotFoundError("no such pool in this tenant", details={"path": "pool_id"})
    await _image_of_kind(call, input.ramdisk_kernel, "kernel", input.tenant, "ramdisk_kernel")
    await _image_of_kind(call, input.ramdisk_initrd, "initrd", input.tenant, "ramdisk_initrd")
    site_id = f"site_{secrets.token_hex(8)}"
    async with call.transaction() as tx:
        record = await tx.repository(METAL).create_site(
            id=site_id,
            tenant=input.tenant,
            pool_id=input.pool_id,
            name=input.name,
            kernel=input.ramdisk_kernel,
            initrd=input.ramdisk_initrd,
        )
        if record is None:
            raise ConflictError("the tenant has a site of that name", details={"path": "name"})
        await tx.project(ResourceRef(type=SITE, id=site_id, tenant=input.tenant, pool=input.pool_id))
        call.describe(resource_type=SITE, resource_id=site_id, tenant=input.tenant, details={"name": input.name})
    return site_view(record)


@method(mutates=False, resource=_in_tenant)
async def list_sites(call: CallContext, input: ListSitesInput) -> ListSitesOutput:
    """A page of a tenant's sites, oldest first."""
    scope = call.method.action
    after = _SITE_PAGES.after(scope, input.cursor)
    records = await call.context.store.repository(METAL).list_sites(input.tenant, after=after, limit=input.limit + 1)
    sites, next_cursor = _SITE_PAGES.page(scope, [site_view(r) for r in records], input.limit)
    return ListSitesOutput(sites=sites, next_cursor=next_cursor)


@method(mutates=False, resource=_on_site)
async def get_site(call: CallContext, input: GetSiteInput) -> Site:
    """A site by id, with the agent holding its boot lease."""
    return site_view(await existing_site(call, input.id))


def site_join_command(token: str, settings: JoinSettings | None, ca_pin: str | None) -> str:
    """The ``bcd site join`` command line for ``token``: the gateway and the CA pin as far as they are known."""
    parts = ["bcd", "site", "join", "--token", token]
    if settings is not None:
        parts += ["--gateway", settings.gateway_address]
    if ca_pin is not None:
        parts += ["--ca-pin", ca_pin]
    return shlex.join(parts)


async def _ca_pin(call: CallContext) -> str | None:
    """The pin of the live CA bundle (what ``--ca-pin`` checks the gateway's bundle against)."""
    settings = call.context.settings.get(JoinSettings)
    if settings is None:
        return None
    keys = await call.context.store.repository(CERTIFICATES).keys(settings.trust_domain)
    bundle = trust_bundle_pem_of(keys)
    return bundle_pin(bundle) if bundle else None


@method(mutates=True, resource=_on_site, replayable=False)
async def create_site_token(call: CallContext, input: CreateSiteTokenInput) -> CreatedSiteToken:
    """Mint a token a site agent enrolls with; the token is in this answer only.

    Raises:
        NotFoundError: there is no such site.
    """
    site = await existing_site(call, input.site_id)
    token_id, token, secret_hash = new_token(SITE_TOKEN_PREFIX, "st_")
    expires_at = call.context.clock.now() + dt.timedelta(seconds=input.expires_in_seconds)
    async with call.transaction() as tx:
        await tx.repository(METAL).create_site_token(
            id=token_id, site_id=site.id, secret_hash=secret_hash, uses=input.uses, expires_at=expires_at
        )
        call.describe(
            resource_type="site-token",
            resource_id=token_id,
            tenant=site.tenant,
            details={"site_id": site.id, "uses": input.uses},
        )
    return CreatedSiteToken(
        id=token_id,
        site_id=site.id,
        token=token,
        uses=input.uses,
        expires_at=expires_at,
        command=site_join_command(token, call.context.settings.get(JoinSettings), await _ca_pin(call)),
    )


# --- machines ---------------------------------------------------------------------------------------------------


@method(mutates=True, resource=_on_site)
async def enroll(call: CallContext, input: EnrollInput) -> Machine:
    """Enroll a machine by its BMC at a site: its credentials are sealed by the KMS, then a workflow inspects it
    over Redfish (``enrolled`` -> ``inspected``; ``metal.get`` shows the step and any reason).

    Raises:
        InvalidInputError: the BMC's TLS is trusted neither by a CA nor by a pin, or by both.
        NotFoundError: there is no such site.
        ConflictError: a machine with this BMC URL is enrolled already.
        FailedPreconditionError: the control plane has no KMS.
    """
    bmc = input.bmc
    bmc_url = parse_bmc_url(bmc.url, field="bmc.url")  # no user info, one spelling per BMC (the URL is unique)
    if (bmc.ca_pem is None) == (bmc.pin_sha256 is None):
        raise InvalidInputError(
            "bmc: trust its TLS by exactly one of ca_pem or pin_sha256", details={"path": "bmc.pin_sha256"}
        )
    kms = require_kms(call.context.kms)
    site = await existing_site(call, input.site_id)
    machine_id = f"mch_{secrets.token_hex(8)}"
    sealed = await kms.encrypt(
        json.dumps({"username": bmc.username, "password": bmc.password}).encode(),
        context=credentials_context(machine_id),
    )
    tls = {"ca_pem": bmc.ca_pem} if bmc.ca_pem is not None else {"pin_sha256": bmc.pin_sha256}
    async with call.transaction() as tx:
        record = await tx.repository(METAL).create_machine(
            id=machine_id,
            tenant=site.tenant,
            pool_id=site.pool_id,
            site_id=site.id,
            name=input.name,
            node_id=f"node_{secrets.token_hex(8)}",
            bmc_url=bmc_url,
            bmc_username=bmc.username,
            bmc_tls=tls,
            bmc_secret=sealed,
        )
        if record is None:
            raise ConflictError("a machine with this BMC URL or name is enrolled already", details={"path": "bmc.url"})
        await tx.project(ResourceRef(type=MACHINE, id=machine_id, tenant=site.tenant, pool=site.pool_id))
        record = await start(tx, INSPECT, record)
        call.describe(
            resource_type=MACHINE,
            resource_id=machine_id,
            tenant=site.tenant,
            details={"site_id": site.id, "bmc_url": bmc_url},
        )
    return machine_view(record)


@method(mutates=False, resource=_on_machine)
async def get_machine(call: CallContext, input: MachineInput) -> Machine:
    """A machine: its state, its workflow's current step and reason, what inspection and the ramdisk found, and what
    its site's boot server last saw of it."""
    machine = await existing_machine(call, input.id)
    seen = await call.context.store.repository(METAL).boot_records(machine.id, limit=BOOT_RECORDS_SHOWN)
    return machine_view(machine, tuple(seen))


@method(mutates=False, resource=_in_tenant)
async def list_machines(call: CallContext, input: ListMachinesInput) -> ListMachinesOutput:
    """A page of a tenant's machines (optionally one site's), oldest first."""
    scope = call.method.action
    after = _MACHINE_PAGES.after(scope, input.cursor)
    records = await call.context.store.repository(METAL).list_machines(
        input.tenant, site_id=input.site_id, after=after, limit=input.limit + 1
    )
    machines, next_cursor = _MACHINE_PAGES.page(scope, [machine_view(r) for r in records], input.limit)
    return ListMachinesOutput(machines=machines, next_cursor=next_cursor)


async def _start_from(
    call: CallContext, machine_id: str, workflow: Any, allowed: frozenset[str], **data: Any
) -> Machine:
    async with call.transaction() as tx:
        record = await tx.repository(METAL).lock_machine(machine_id)
        if record is None:
            raise NotFoundError("no such machine", details={"id": machine_id})
        if record.state not in allowed:
            raise FailedPreconditionError(
                f"the machine is {record.state}; this needs it {' or '.join(sorted(allowed))}",
                details={"state": record.state, "allowed": sorted(allowed)},
            )
        record = await start(tx, workflow, record, **data)
        call.describe(
            resource_type=MACHINE,
            resource_id=machine_id,
            tenant=record.tenant,
            details={"workflow": workflow.name, **{k: v for k, v in data.items() if isinstance(v, str)}},
        )
    return machine_view(record)


@method(mutates=True, resource=_on_machine)
async def commission(call: CallContext, input: MachineInput) -> Machine:
    """Commission an inspected machine: PXE into the ramdisk, diagnose, wipe the disks, then ``ready``.

    Raises:
        NotFoundError: there is no such machine.
        FailedPreconditionError: the machine is not ``inspected`` (or ``ready``, to commission again).
    """
    return await _start_from(call, input.id, COMMISSION, frozenset({"inspected", "ready"}))


@method(mutates=True, resource=_on_machine)
async def deploy(call: CallContext, input: DeployInput) -> Machine:
    """Deploy a registered disk image to a ready machine's disk; the installed system then joins the pool as the
    machine's node id and goes through the pool's acceptance checks (``deployed`` once its node is adopted).

    Raises:
        NotFoundError: there is no such machine, or no such image in its tenant.
        InvalidInputError: the image is not a raw disk image, the disk is not one the ramdisk reported, or it is
            smaller than the image's ``min_disk_gib``.
        FailedPreconditionError: the machine is not ``ready``.
    """
    machine = await existing_machine(call, input.id)
    image = await call.context.store.repository(IMAGES).get(input.image_id)
    if image is None or image.tenant != machine.tenant:
        raise NotFoundError("no such image in this tenant", details={"path": "image_id"})
    if image.kind != "disk":
        raise InvalidInputError(f"image_id: the image is a {image.kind}, not a disk", details={"path": "image_id"})
    if image.format != "raw":
        # The ramdisk streams the image's bytes onto the disk as they are: only a raw image boots.
        raise InvalidInputError(
            f"image_id: bare metal deploys raw disk images, not {image.format}", details={"path": "image_id"}
        )
    reported = machine.results.get("diagnose", {}).get("disks", [])
    disks = [d.get("name") for d in reported if isinstance(d, dict)]
    disk = input.disk or (disks[0] if disks else None)
    if disk is None or disk not in disks:
        raise InvalidInputError("disk: not a disk the ramdisk reported", details={"path": "disk", "disks": disks})
    size = next((d.get("size_bytes") for d in reported if isinstance(d, dict) and d.get("name") == disk), None)
    if image.min_disk_gib is not None and isinstance(size, int) and size < image.min_disk_gib * 2**30:
        raise InvalidInputError(
            f"disk: the image needs at least {image.min_disk_gib} GiB, the disk has {size} bytes",
            details={"path": "disk", "min_disk_gib": image.min_disk_gib},
        )
    return await _start_from(call, input.id, DEPLOY, frozenset({"ready"}), image_id=image.id, disk=disk)


@method(mutates=True, resource=_on_machine)
async def release(call: CallContext, input: MachineInput) -> Machine:
    """Release a deployed machine: PXE into the ramdisk, wipe its disks, and return it to ``ready``.

    Raises:
        NotFoundError: there is no such machine.
        FailedPreconditionError: the machine is not ``deployed``.
    """
    return await _start_from(call, input.id, RELEASE, frozenset({"deployed"}))


@method(mutates=True, resource=_on_machine)
async def retry(call: CallContext, input: MachineInput) -> Machine:
    """Run a failed machine's workflow again from its start (inspection, commissioning, deploy or release).

    Raises:
        NotFoundError: there is no such machine.
        FailedPreconditionError: the machine has not failed.
    """
    machine = await existing_machine(call, input.id)
    allowed = frozenset({"failed"})
    if machine.state != "failed" and machine.workflow_id is not None:
        # A workflow the engine itself gave up on (its own failures retried for hours) leaves the machine as it was.
        record = await call.context.store.repository(WORKFLOWS).get(machine.workflow_id)
        if record is not None and record.state in ("failed", "cancelled"):
            allowed = frozenset({machine.state})
    if machine.state not in allowed:
        raise FailedPreconditionError(
            f"the machine is {machine.state}; only a failed machine is retried", details={"state": machine.state}
        )
    workflow = by_name(str(machine.results.get("workflow", "metal-inspect")))
    data = {k: v for k, v in dict(machine.results.get("workflow_data", {})).items() if isinstance(v, str)}
    return await _start_from(call, input.id, workflow, allowed, **data)


@method(mutates=True, resource=_on_machine)
async def power(call: CallContext, input: PowerInput) -> PowerOutput:
    """A power action through the machine's BMC (no workflow: it answers once the BMC accepted it).

    Raises:
        NotFoundError: there is no such machine.
        UnavailableError: the BMC is unreachable or answered with an error (``reason`` says which).
        FailedPreconditionError: the BMC refused the credentials or its TLS does not match.
    """
    machine = await existing_machine(call, input.id)
    try:
        async with await bmc_client(call.context, machine) as client:
            await client.power(input.action)
            state = await client.power_state()
    except RedfishError as exc:
        raise bmc_error(exc) from None
    # The BMC call is made; its audit row (and the power state seen) commit after it, never around it.
    async with call.transaction() as tx:
        await tx.repository(METAL).update_machine(machine.id, power_state=state)
        call.describe(
            resource_type=MACHINE, resource_id=machine.id, tenant=machine.tenant, details={"action": input.action}
        )
    return PowerOutput(id=machine.id, action=input.action, power_state=state)
