"""The site's and the ramdisk's gateway methods (``docs/metal-wire.md`` is their contract).

- ``site.join`` (open): a site token for a ``site`` certificate.
- ``site.sync`` (role ``site``): renew or take the site's boot lease, hand in boot records, get the boot plan.
- ``ramdisk.join`` (open): a machine's ramdisk token, with the machine's own UUID and serial, for a ``ramdisk``
  certificate of at most 2 hours.
- ``ramdisk.task`` (role ``ramdisk``): a signed report of the last task in, the next task out.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bettercompute import GatewayCall, GatewayMethod, JoinSettings, signal_workflow_in
from bettercompute.errors import (
    AccessDeniedError,
    ComputeError,
    FailedPreconditionError,
    InvalidInputError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
)
from bettercompute.modules.images import IMAGES
from bettercompute.modules.inventory import FactVerdict, judge_nvml
from bettercompute.modules.nodes import JOIN_KEYS, SignedFact, fact_refusal, hardware_key_of
from bettercompute.modules.pools import POOLS, NodePolicy
from bettercompute.ports import AuditRecord, Store
from bettercompute_metal._port import METAL, MachineRecord
from bettercompute_metal._tokens import (
    RAMDISK_TOKEN_PREFIX,
    SITE_TOKEN_PREFIX,
    bundle_pin,
    join_token_context,
    parse_token,
    token_context,
)

__all__ = ["GATEWAY_METHODS", "SIGNED_REPORTS", "report_message", "verify_reports"]

log = logging.getLogger("bettercompute.metal")

BOOT_LEASE_TTL = dt.timedelta(seconds=15)
SYNC_EVERY = dt.timedelta(seconds=3)
MAX_RECORDS = 500
RAMDISK_TTL = dt.timedelta(hours=2)
REPORT_MAX_AGE = dt.timedelta(minutes=10)
MAX_RESULT_BYTES = 256 * 1024
POLL_MS = 2000
_REPORT = b"bettercompute/ramdisk-report/v1\n"
_KINDS = frozenset({"dhcp", "tftp", "script", "file"})
_HTTP_BASE = re.compile(r"http://[A-Za-z0-9.:\[\]-]{1,200}:[0-9]{1,5}")


def _text(input: Mapping[str, Any], key: str, *, limit: int = 256, required: bool = True) -> str | None:
    value = input.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= limit or not value.isprintable():
        raise InvalidInputError(f"{key}: expected text of 1 to {limit} printable characters", details={"path": key})
    return value


def _csr(input: Mapping[str, Any]) -> str:
    value = input.get("csr_pem")
    if not isinstance(value, str) or not 0 < len(value) <= 16384:
        raise InvalidInputError("csr_pem: expected a PEM certificate signing request", details={"path": "csr_pem"})
    return value


def _certificate_answer(issued: Any, bundle_pem: str) -> dict[str, Any]:
    return {
        "certificate_pem": issued.certificate_pem,
        "chain_pem": issued.chain_pem,
        "trust_bundle_pem": bundle_pem,
        "not_after_ms": int(issued.not_after.timestamp() * 1000),
    }


# --- site -------------------------------------------------------------------------------------------------------


async def site_join(call: GatewayCall) -> Mapping[str, Any]:
    """A ``site`` certificate for the holder of a site token (one use spent).

    Raises:
        UnauthenticatedError: the token is malformed, unknown, expired or used up (the answer does not say which).
    """
    parsed = parse_token(call.input.get("token"), SITE_TOKEN_PREFIX)
    csr_pem = _csr(call.input)
    if parsed is None:
        raise UnauthenticatedError("the site token is not valid", details={"reason": "invalid_token"})
    token_id, secret_hash = parsed
    context = call.context
    await call.issuer.prepare()
    async with context.store.transaction() as tx:
        use = await tx.repository(METAL).use_site_token(token_id, secret_hash, now=context.clock.now())
        if use.site is None:
            log.info("a site join was refused: %s", use.refusal)
            raise UnauthenticatedError("the site token is not valid", details={"reason": "invalid_token"})
        site = use.site
        issued = await call.issuer.issue_in(tx, csr_pem, node_id=site.id, role="site")
        await tx.audit(
            AuditRecord(
                action="compute:sites:join",
                actor=f"site:{site.id}",
                tenant=site.tenant,
                resource_type="site",
                resource_id=site.id,
                decision_id=None,
                outcome="ok",
                details={"token_id": token_id, "serial": issued.serial},
            )
        )
    bundle = await call.issuer.trust_bundle_pem()
    log.info("site %s joined", site.id)
    return {"site_id": site.id, "tenant": site.tenant, **_certificate_answer(issued, bundle)}


def _records(value: Any, site_machines: Mapping[str, MachineRecord]) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_RECORDS:
        raise InvalidInputError(f"records: expected at most {MAX_RECORDS} records", details={"path": "records"})
    kept = []
    for index, record in enumerate(value):
        path = f"records[{index}]"
        kind = record.get("kind") if isinstance(record, dict) else None
        if not isinstance(kind, str) or kind not in _KINDS:
            raise InvalidInputError(f"{path}: not a boot record", details={"path": path})
        machine_id = record.get("machine_id")
        machine_id = machine_id if isinstance(machine_id, str) else None
        at_ms = record.get("at_ms")
        if isinstance(at_ms, bool) or not isinstance(at_ms, int) or not 0 <= at_ms < 2**45:
            raise InvalidInputError(f"{path}.at_ms: expected milliseconds", details={"path": f"{path}.at_ms"})
        kept.append(
            {
                # Only a machine of this site: a site cannot write records on another's machines.
                "machine_id": machine_id if machine_id in site_machines else None,
                "kind": record["kind"],
                "mac": _text(record, "mac", limit=64, required=False),
                "system_uuid": _text(record, "system_uuid", limit=64, required=False),
                "detail": (_text(record, "detail", limit=512, required=False) or ""),
                "at": dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC).isoformat(),
            }
        )
    return kept


def _http_base(value: Any) -> str | None:
    """The site's ``http://<address>:<port>`` (where a ramdisk fetches a deploy's image from the site's cache)."""
    if value is None:
        return None
    if not isinstance(value, str) or not _HTTP_BASE.fullmatch(value):
        raise InvalidInputError("http_base: expected http://<address>:<port>", details={"path": "http_base"})
    return value


def _file(image: Any) -> dict[str, Any]:
    return {"sha256": image.sha256, "url": image.url, "size": image.size}


async def _plan(call: GatewayCall, machines: Sequence[MachineRecord], kernel: Any, initrd: Any) -> dict[str, Any]:
    context = call.context
    settings = context.settings.get(JoinSettings)
    pin = bundle_pin(await call.issuer.trust_bundle_pem())
    entries = []
    seen: set[str] = set()
    for machine in machines:
        if not machine.macs and machine.system_uuid is None:
            continue
        names = {*machine.macs, *([machine.system_uuid] if machine.system_uuid else [])}
        if names & seen:
            # Inspection refuses a second machine with the same MAC or UUID; one that got through boots nothing.
            log.warning("machine %s shares a MAC or UUID with another of its site: left out of the plan", machine.id)
            continue
        seen |= names
        entry: dict[str, Any] = {
            "machine_id": machine.id,
            "macs": list(machine.macs),
            "system_uuid": machine.system_uuid,
            "action": "local",
            "kernel": None,
            "initrd": None,
            "cmdline": "",
        }
        sealed = machine.boot.get("token")
        if machine.boot.get("action") == "ramdisk" and sealed and kernel is not None and context.kms is not None:
            try:
                opened = await context.kms.decrypt(base64.b64decode(sealed), context=token_context(machine.id))
            except Exception as exc:  # one machine's token not opening never takes the site's plan down
                log.error("the ramdisk token of machine %s did not open: %s", machine.id, type(exc).__name__)
                entries.append(entry)
                continue
            token = opened.decode()
            gateway = settings.gateway_address if settings is not None else ""
            # A deploy's image is cached and served by the site too: the machine may reach nothing else.
            image = None
            if machine.state == "deploying" and machine.image_id is not None:
                image = await context.store.repository(IMAGES).get(machine.image_id)
            entry["image"] = _file(image) if image is not None else None
            entry.update(
                action="ramdisk",
                kernel=_file(kernel),
                initrd=_file(initrd) if initrd else None,
                cmdline=f"bc.machine={machine.id} bc.gateway={gateway} bc.ca_pin={pin} bc.token={token}",
            )
        entries.append(entry)
    generation = int(hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:12], 16)
    return {"generation": generation, "entries": entries}


async def site_sync(call: GatewayCall) -> Mapping[str, Any]:
    """Renew or take the site's boot lease for the calling agent, keep its boot records, answer the boot plan."""
    assert call.caller is not None
    agent = _text(call.input, "agent", limit=128)
    assert agent is not None
    http_base = _http_base(call.input.get("http_base"))
    context = call.context
    store = context.store
    repository = store.repository(METAL)
    site = await repository.get_site(call.caller.id)
    if site is None:
        raise AccessDeniedError("the site no longer exists", details={"reason": "site_gone"})
    active, holder, _ = await repository.sync_boot_lease(
        site.id, agent, ttl=BOOT_LEASE_TTL, now=context.clock.now(), http_base=http_base
    )
    answer: dict[str, Any] = {
        "active": active,
        "holder": holder,
        "lease_ttl_ms": int(BOOT_LEASE_TTL.total_seconds() * 1000),
        "sync_after_ms": int(SYNC_EVERY.total_seconds() * 1000),
        "plan": {"generation": 0, "entries": []},
    }
    if not active:
        return answer
    machines = await repository.machines_at_site(site.id)
    records = _records(call.input.get("records"), {m.id: m for m in machines})
    if records:
        async with store.transaction() as tx:
            await tx.repository(METAL).add_boot_records(site.id, records)
    images = store.repository(IMAGES)
    kernel = await images.get(site.ramdisk_kernel) if site.ramdisk_kernel else None
    initrd = await images.get(site.ramdisk_initrd) if site.ramdisk_initrd else None
    answer["plan"] = await _plan(call, machines, kernel, initrd)
    return answer


# --- ramdisk ----------------------------------------------------------------------------------------------------


async def ramdisk_join(call: GatewayCall) -> Mapping[str, Any]:
    """A ``ramdisk`` certificate (at most 2 hours) for the machine whose ramdisk token this is, when the claims name
    the machine's own UUID and serial as Redfish inspection read them. The token is spent.

    Raises:
        UnauthenticatedError: the token is malformed, unknown, spent or expired.
        AccessDeniedError: the claims are not the machine's (``hardware_mismatch``).
    """
    parsed = parse_token(call.input.get("token"), RAMDISK_TOKEN_PREFIX)
    csr_pem = _csr(call.input)
    claims = call.input.get("claims")
    if not isinstance(claims, dict):
        raise InvalidInputError("claims: expected an object", details={"path": "claims"})
    if parsed is None:
        raise UnauthenticatedError("the ramdisk token is not valid", details={"reason": "invalid_token"})
    token_id, secret_hash = parsed
    machine_id = _text(call.input, "machine_id", limit=128, required=False)
    context = call.context
    now = context.clock.now()
    await call.issuer.prepare()
    async with context.store.transaction() as tx:
        repository = tx.repository(METAL)
        machine = await repository.lock_machine(machine_id) if machine_id else None
        token = machine.ramdisk_token if machine is not None else None
        if (
            machine is None
            or token is None
            or token.get("id") != token_id
            or not hmac.compare_digest(bytes.fromhex(str(token.get("hash", ""))), secret_hash)
            or token.get("used")
            or dt.datetime.fromisoformat(str(token["expires_at"])) <= now
        ):
            raise UnauthenticatedError("the ramdisk token is not valid", details={"reason": "invalid_token"})
        uuid = str(claims.get("system_uuid") or "").lower()
        serial = claims.get("serial")
        if uuid != (machine.system_uuid or "") or serial != machine.serial:
            raise AccessDeniedError(
                "the ramdisk runs on other hardware than the machine's", details={"reason": "hardware_mismatch"}
            )
        issued = await call.issuer.issue_in(tx, csr_pem, node_id=machine.id, role="ramdisk", ttl=RAMDISK_TTL)
        # Only this certificate acts for the machine in this workflow (``ramdisk.task`` compares the serial); the next
        # workflow's token replaces the record, and with it the certificate's standing.
        await repository.update_machine(
            machine.id,
            ramdisk_token={**token, "used": True, "serial": issued.serial},
            message="ramdisk joined",
        )
        await tx.audit(
            AuditRecord(
                action="compute:metal:ramdisk-join",
                actor=f"ramdisk:{machine.id}",
                tenant=machine.tenant,
                resource_type="machine",
                resource_id=machine.id,
                decision_id=None,
                outcome="ok",
                details={"serial": issued.serial},
            )
        )
    bundle = await call.issuer.trust_bundle_pem()
    log.info("the ramdisk of machine %s joined", machine.id)
    return {"machine_id": machine.id, **_certificate_answer(issued, bundle)}


def report_message(
    *, machine_id: str, task_id: str, kind: str, ok: bool, result: Any, error: Any, signed_at_ms: int
) -> bytes:
    """What a ramdisk signs for a report (``docs/metal-wire.md``)."""
    body = {
        "machine_id": machine_id,
        "task_id": task_id,
        "kind": kind,
        "ok": ok,
        "result": result,
        "error": error,
        "signed_at_ms": signed_at_ms,
    }
    return _REPORT + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _verify_report(call: GatewayCall, machine_id: str, report: Mapping[str, Any]) -> None:
    assert call.caller is not None
    signed_at_ms = report.get("signed_at_ms")
    if isinstance(signed_at_ms, bool) or not isinstance(signed_at_ms, int) or not 0 < signed_at_ms < 2**45:
        raise InvalidInputError("report.signed_at_ms: expected milliseconds", details={"path": "report.signed_at_ms"})
    signed_at = dt.datetime.fromtimestamp(signed_at_ms / 1000, dt.UTC)
    now = call.context.clock.now()
    if not now - REPORT_MAX_AGE <= signed_at <= now + dt.timedelta(minutes=1):
        raise UnauthenticatedError("the report is too old or from the future", details={"reason": "stale_report"})
    try:
        signature = base64.b64decode(str(report.get("signature", "")), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInputError("report.signature: expected base64", details={"path": "report.signature"}) from None
    message = report_message(
        machine_id=machine_id,
        task_id=str(report.get("task_id")),
        kind=str(report.get("kind")),
        ok=bool(report.get("ok")),
        result=report.get("result"),
        error=report.get("error"),
        signed_at_ms=signed_at_ms,
    )
    key = call.caller.certificate.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise UnauthenticatedError("the ramdisk's key cannot sign reports", details={"reason": "bad_signature"})
    try:
        key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise UnauthenticatedError(
            "the report is not signed by the ramdisk's key", details={"reason": "bad_signature"}
        ) from None


SIGNED_REPORTS = "signed_reports"
"""The key of a machine's ``results`` under which each ramdisk report is kept as signed (beside its result), so that
``verify_reports`` can check it again later."""


def _signed_report(call: GatewayCall, report: Mapping[str, Any]) -> dict[str, Any]:
    """What a report's signature covers besides its result (kept under ``results[kind]`` when it is an object), with
    the signature, the ramdisk certificate's serial and its public key."""
    assert call.caller is not None
    key = call.caller.certificate.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    kept = {
        "task_id": str(report.get("task_id")),
        "ok": bool(report.get("ok")),
        "error": report.get("error"),
        "signed_at_ms": report.get("signed_at_ms"),
        "signature": str(report.get("signature")),
        "serial": call.caller.serial,
        "key": base64.b64encode(key).decode(),
    }
    if not isinstance(report.get("result"), dict):
        kept["result"] = report.get("result")  # not kept as the task's result: kept here, as signed
    return kept


async def verify_reports(store: Store, machine_id: str) -> list[FactVerdict]:
    """Every ramdisk report a machine's results rely on, checked again now against the certificates and revocations
    as they are now (``fact`` ``ramdisk_report``, ``id`` the task's kind).

    Raises:
        NotFoundError: no such machine.
    """
    machine = await store.repository(METAL).get_machine(machine_id)
    if machine is None:
        raise NotFoundError("no such machine", details={"id": machine_id})
    found: list[FactVerdict] = []
    for kind, kept in sorted((machine.results.get(SIGNED_REPORTS) or {}).items()):
        signed: SignedFact | None
        try:
            signed = SignedFact(
                signature=base64.b64decode(str(kept.get("signature")), validate=True),
                serial=str(kept.get("serial")),
                key=base64.b64decode(str(kept.get("key")), validate=True),
            )
            message = report_message(
                machine_id=machine.id,
                task_id=str(kept.get("task_id")),
                kind=kind,
                ok=bool(kept.get("ok")),
                result=kept["result"] if "result" in kept else machine.results.get(kind),
                error=kept.get("error"),
                signed_at_ms=int(kept.get("signed_at_ms") or 0),
            )
        except (binascii.Error, ValueError, TypeError, AttributeError):
            signed, message = None, b""
        why = await fact_refusal(store, node_id=machine.id, message=message, signed=signed)
        serial = signed.serial if signed is not None else None
        found.append(
            FactVerdict(node_id=machine.id, fact="ramdisk_report", id=kind, verdict=why or "ok", signer_serial=serial)
        )
    return found


def _hardware_key(diagnosis: Mapping[str, Any], machine: MachineRecord) -> tuple[str | None, str | None]:
    """The hardware key of the claims the ramdisk read (what ``bcd join`` will send from the installed system),
    and why it cannot be taken: malformed claims, or a UUID that is not the one Redfish reported."""
    claims = diagnosis.get("claims")
    if not isinstance(claims, dict):
        return None, "the diagnosis has no hardware claims"
    if str(claims.get("system_uuid") or "").lower() != (machine.system_uuid or ""):
        return None, "the ramdisk read another system UUID than the BMC reports"
    try:
        return hardware_key_of(claims), None
    except InvalidInputError:
        return None, "the diagnosis's hardware claims are malformed"


async def _check_result(call: GatewayCall, machine: MachineRecord, task: Mapping[str, Any], result: Any) -> str | None:
    """Why a task that says it succeeded did not: GPUs the pool's node policy refuses (the acceptance check
    ``diag.nvml`` judges them alike), a disk whose SMART check failed, a wipe that missed a disk."""
    kind = task["kind"]
    if not isinstance(result, dict):
        return "the result is not an object"
    if len(json.dumps(result)) > MAX_RESULT_BYTES:
        return f"the result is larger than {MAX_RESULT_BYTES} bytes"
    if kind == "deploy":
        image = task["params"].get("image", {})
        if result.get("sha256") != image.get("sha256") or result.get("disk") != machine.disk:
            return "the disk does not hold the image: its checksum or disk differs"
    if kind == "diagnose":
        pool = await call.context.store.repository(POOLS).get(machine.pool_id)
        policy = NodePolicy.from_stored(pool.node_policy) if pool is not None else NodePolicy()
        findings = judge_nvml({"health": result.get("health")}, policy)
        if findings:
            reasons = sorted({str(f.get("reason")) for f in findings})
            return f"the GPUs fail the pool's policy: {', '.join(reasons)}"
        disks = result.get("disks")
        if not isinstance(disks, list):
            return "the diagnosis names no disks"
        for disk in disks:
            smart = disk.get("smart") if isinstance(disk, dict) else None
            if isinstance(smart, dict) and smart.get("passed") is False:
                return f"disk {disk.get('name')} failed its SMART check"
    if kind == "wipe":
        disks = result.get("disks")
        wanted = set(task["params"].get("disks", []))
        if not isinstance(disks, list) or not all(isinstance(d, dict) and d.get("ok") is True for d in disks):
            return "a disk was not wiped"
        if {d.get("name") for d in disks} != wanted:
            return "the wipe did not cover every disk it was given"
    return None


async def _deploy_params(call: GatewayCall, machine: MachineRecord) -> dict[str, Any]:
    """The image to write, the disk, and cloud-init whose first boot runs ``bcd join`` with the deploy's token."""
    context = call.context
    store = context.store
    image = await store.repository(IMAGES).get(machine.image_id) if machine.image_id else None
    sealed = machine.boot.get("join_token")
    settings = context.settings.get(JoinSettings)
    join_key = await store.repository(JOIN_KEYS).active()
    if image is None or not sealed or settings is None or join_key is None or context.kms is None:
        raise FailedPreconditionError("the deploy is not prepared", details={"reason": "not_prepared"})
    token = (await context.kms.decrypt(base64.b64decode(sealed), context=join_token_context(machine.id))).decode()
    command = [
        "bcd",
        "join",
        "--token",
        token,
        "--pool",
        machine.pool_id,
        "--gateway",
        settings.gateway_address,
        "--trust-domain",
        settings.trust_domain,
        "--ca-pin",
        bundle_pin(await call.issuer.trust_bundle_pem()),
        f"--join-key={join_key.public_key}",
    ]
    user_data = "#cloud-config\n" + json.dumps(
        {"runcmd": [command, ["systemctl", "enable", "--now", "bcd"]]}, separators=(",", ":")
    )
    meta_data = json.dumps({"instance-id": machine.id, "local-hostname": machine.name or machine.id})
    site = await store.repository(METAL).get_site(machine.site_id)
    served = _file(image)
    if site is not None and site.boot_http_base:
        served["url"] = f"{site.boot_http_base}/files/{image.sha256}"
    return {
        "image": served,
        "disk": machine.disk,
        "cloud_init": {"user_data": user_data + "\n", "meta_data": meta_data},
    }


async def _next_task(
    call: GatewayCall, machine: MachineRecord, index: int, results: Mapping[str, Any]
) -> dict[str, Any] | None:
    if index >= len(machine.tasks):
        return None
    kind = machine.tasks[index]
    params: dict[str, Any] = {}
    if kind == "wipe":
        disks = results.get("diagnose", {}).get("disks", [])
        params = {"disks": [d.get("name") for d in disks if isinstance(d, dict)]}
    elif kind == "deploy":
        params = await _deploy_params(call, machine)
    return {"task_id": f"{machine.workflow_id}/{index}", "kind": kind, "params": params, "index": index}


_RAMDISK_STATES = frozenset({"commissioning", "deploying", "releasing"})


@attrs.frozen(kw_only=True)
class _Change:
    """What a report (or a first ask) changes on the machine, worked out before the transaction that writes it."""

    task: dict[str, Any] | None
    results: dict[str, Any]
    hardware_key: str | None
    message: str
    done: Mapping[str, Any] | None
    """The ``ramdisk.done`` payload when the ramdisk has nothing left to do."""


def _already_taken(task_id: Any, machine: MachineRecord) -> bool:
    """Whether ``task_id`` is a task of this workflow that was reported already (a report repeated after a lost
    answer)."""
    if not isinstance(task_id, str):
        return False
    workflow, _, index = task_id.rpartition("/")
    if workflow != machine.workflow_id or not index.isdigit():
        return False
    return machine.task is None or int(index) < int(machine.task["index"])


async def _progress(call: GatewayCall, machine: MachineRecord, report: Mapping[str, Any] | None) -> _Change | None:
    """The change ``report`` makes (``None``: none, answer the current task). KMS and store reads happen here,
    outside the transaction that writes the change."""
    task = dict(machine.task) if machine.task else None
    if task is None:
        if not machine.tasks or machine.results.get("ramdisk_done_for") == machine.workflow_id:
            return None
        try:
            first = await _next_task(call, machine, 0, machine.results)
        except ComputeError as exc:
            problem = f"the first task could not be prepared: {exc.message}"
            results = {**machine.results, "ramdisk_done_for": machine.workflow_id}
            return _Change(
                task=None,
                results=results,
                hardware_key=machine.hardware_key,
                message="ramdisk: done",
                done={"ok": False, "kind": "ramdisk", "error": problem},
            )
        kind = first["kind"] if first else ""
        return _Change(
            task=first,
            results=dict(machine.results),
            hardware_key=machine.hardware_key,
            message=f"ramdisk: {kind}",
            done=None,
        )
    if report is None:
        return None
    if report.get("task_id") != task["task_id"] or report.get("kind") != task["kind"]:
        if _already_taken(report.get("task_id"), machine):
            return None
        raise FailedPreconditionError(
            "the report is not of the machine's current task", details={"reason": "not_current_task"}
        )
    why: str | None
    if report.get("ok") is True:
        why = await _check_result(call, machine, task, report.get("result"))
    else:
        why = str(report.get("error") or "failed")[:200]
    results = dict(machine.results)
    results[task["kind"]] = report.get("result") if isinstance(report.get("result"), dict) else {}
    results[SIGNED_REPORTS] = {**(results.get(SIGNED_REPORTS) or {}), task["kind"]: _signed_report(call, report)}
    hardware_key = machine.hardware_key
    if why is None and task["kind"] == "diagnose":
        hardware_key, why = _hardware_key(results["diagnose"], machine)
        if why is None and "deploy" in machine.tasks and hardware_key != machine.hardware_key:
            # The deploy's join token is bound to the hardware commissioning saw.
            why = "the hardware changed since commissioning: commission the machine again"
    following = None
    if why is None:
        try:
            following = await _next_task(call, machine, int(task["index"]) + 1, results)
        except ComputeError as exc:
            why = f"the next task could not be prepared: {exc.message}"
    done = None
    if following is None:
        results["ramdisk_done_for"] = machine.workflow_id
        done = {"ok": why is None, "kind": task["kind"], "error": why}
    return _Change(
        task=following,
        results=results,
        hardware_key=hardware_key,
        message=f"ramdisk: {following['kind']}" if following else "ramdisk: done",
        done=done,
    )


async def ramdisk_task(call: GatewayCall) -> Mapping[str, Any]:
    """Take the ramdisk's report of its current task (signed by its key) and hand out the next one.

    Asking again without a report answers the current task again; a report repeated after its answer was lost
    answers as the first did.

    Raises:
        UnauthenticatedError: the report is not signed by the ramdisk's key, or is stale.
        FailedPreconditionError: the report is of another task than the machine's current one.
        UnavailableError: the machine changed while the report was taken (``changed``): report again.
    """
    assert call.caller is not None
    machine_id = call.caller.id
    report = call.input.get("report")
    if report is not None and not isinstance(report, dict):
        raise InvalidInputError("report: expected an object", details={"path": "report"})
    if report is not None:
        _verify_report(call, machine_id, report)
    store = call.context.store
    snapshot = await store.repository(METAL).get_machine(machine_id)
    if snapshot is None or snapshot.state not in _RAMDISK_STATES:
        return {"task": None, "done": True, "reboot": False, "poll_after_ms": POLL_MS}
    if (snapshot.ramdisk_token or {}).get("serial") != call.caller.serial:
        raise AccessDeniedError(
            "this ramdisk certificate is not the one of the machine's current boot",
            details={"reason": "not_current_ramdisk"},
        )
    change = await _progress(call, snapshot, report)
    if change is not None:
        async with store.transaction() as tx:
            machine = await tx.repository(METAL).lock_machine(machine_id)
            if machine is None or machine.updated_at != snapshot.updated_at:
                raise UnavailableError(
                    "the machine changed while the report was taken: report again", details={"reason": "changed"}
                )
            await tx.repository(METAL).update_machine(
                machine_id,
                results=change.results,
                hardware_key=change.hardware_key,
                task=change.task,
                message=change.message,
            )
            if change.done is not None and machine.workflow_id is not None:
                await signal_workflow_in(tx, machine.workflow_id, "ramdisk.done", change.done)
    task = change.task if change is not None else (dict(snapshot.task) if snapshot.task else None)
    answer_task = {k: v for k, v in task.items() if k != "index"} if task else None
    # After a deploy the ramdisk reboots into the installed system; otherwise the workflow powers it off.
    deployed = change.done if change is not None and change.done is not None else None
    reboot = answer_task is None and "deploy" in snapshot.tasks and (deployed is None or deployed.get("ok") is True)
    return {"task": answer_task, "done": answer_task is None, "reboot": reboot, "poll_after_ms": POLL_MS}


GATEWAY_METHODS = (
    GatewayMethod(name="site.join", roles={"site"}, handler=site_join, open=True),
    GatewayMethod(name="site.sync", roles={"site"}, handler=site_sync),
    GatewayMethod(name="ramdisk.join", roles={"ramdisk"}, handler=ramdisk_join, open=True),
    GatewayMethod(name="ramdisk.task", roles={"ramdisk"}, handler=ramdisk_task),
)
