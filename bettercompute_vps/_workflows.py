"""Provider pools: the ``vps-provider`` workflow drives an instance at its provider towards what it should be.

Every change of an instance (creation, start, stop, reboot, resize, delete) bumps its ``spec`` and starts one
workflow for that spec (its id names both, so the same change never starts two). A workflow whose spec is no longer
the instance's bows out at its next step, so at most one step of an older one overlaps a newer one, and every call
it makes is safe to repeat: a launch carries the instance's client token (a retried or resumed launch finds the
instance it made instead of making another), stop, start and terminate are idempotent at the provider.

Steps:
- ``launch``: find the instance made with the client token, else launch it; record the provider's id.
- ``converge``: one pass per attempt, polling every few seconds: power it on or off, change its type (stopped
  first), reboot it (stop, then start), terminate it. When it is as it should be, the instance shows ``running`` or
  ``stopped`` with its addresses, or ``deleted`` once the provider says it is terminated.

A provider error that may pass (throttled, unavailable) is retried with backoff while the instance shows it as its
``reason``; any other (quota at the provider, an unknown image, refused credentials) fails the instance with it.
No agent of ours ever runs in the tenant's VM: the provider is only ever called from here.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from bettercompute import (
    ModuleContext,
    RetryPolicy,
    Step,
    StepContext,
    StepOutcome,
    Workflow,
    start_workflow_in,
)
from bettercompute.errors import ComputeError
from bettercompute.modules.images import IMAGES
from bettercompute.ports import Transaction
from bettercompute_vps._lifecycle import event, finish_delete
from bettercompute_vps._port import VPS, InstanceRecord, PoolSettings
from bettercompute_vps._provider import (
    LaunchRequest,
    ProviderAdapter,
    ProviderError,
    ProviderInstance,
    compose_user_data,
)

__all__ = ["PROVIDER", "AdapterFactory", "default_adapters", "provider_workflow", "start_provider"]

log = logging.getLogger("bettercompute.vps")

AdapterFactory = Callable[[Mapping[str, Any], Mapping[str, Any]], ProviderAdapter]
"""Makes a provider's adapter from the pool's provider settings and the decrypted credentials."""

POLL = dt.timedelta(seconds=2)
"""How long the converge step waits between two looks at the provider."""
MAX_PASSES = 1800
"""Passes of the converge step before the instance fails with ``PROVIDER_TIMEOUT`` (about an hour at ``POLL``)."""
RETRYABLE_ATTEMPTS = 8
"""Attempts of one step at a provider error that may pass, before the instance fails with it."""


def _ec2(settings: Mapping[str, Any], credentials: Mapping[str, Any]) -> ProviderAdapter:
    # Imported on first use: boto3 is an optional dependency (the ``ec2`` extra).
    try:
        from bettercompute_vps._ec2 import Ec2Adapter
    except ImportError:
        raise ProviderError(
            "PROVIDER_INVALID", "the EC2 adapter needs boto3 (install bettercompute[ec2])", retryable=False
        ) from None
    wanted = {k: settings[k] for k in ("region", "endpoint_url", "subnet_id") if settings.get(k) is not None}
    try:
        return Ec2Adapter.from_config(wanted, credentials)
    except ComputeError as exc:
        # Never the secret's value: the message names the field that is missing or malformed.
        path = exc.details.get("path") if isinstance(exc.details, dict) else None
        code = (
            "PROVIDER_AUTH_FAILED"
            if path in ("access_key_id", "secret_access_key", "session_token")
            else "PROVIDER_INVALID"
        )
        raise ProviderError(code, f"the pool's EC2 settings or credentials are not usable ({path})") from None


def default_adapters() -> dict[str, AdapterFactory]:
    """The adapters built in: ``ec2``."""
    return {"ec2": _ec2}


async def start_provider(tx: Transaction, record: InstanceRecord, *, reboot: bool = False) -> InstanceRecord:
    """Start the workflow of the instance's current spec in ``tx`` and show it on the instance (``reboot``: the
    change is a reboot, a stop and a start at the provider)."""
    workflow_id = await start_workflow_in(
        tx,
        PROVIDER,
        tenant=record.tenant,
        subject=record.id,
        data={"spec": record.spec, "reboot": reboot},
        id=f"wf-vps-{record.id}-{record.spec}",
    )
    updated = await tx.repository(VPS).update_instance(record.id, workflow_id=workflow_id)
    assert updated is not None
    return updated


async def _credentials(context: ModuleContext, settings: PoolSettings) -> Mapping[str, Any]:
    from bettercompute.modules.secrets import SECRETS

    provider = settings.provider or {}
    name = str(provider.get("credentials_secret"))
    found = await context.store.repository(SECRETS).named(
        name, scopes=[f"pool:{settings.pool_id}"], tenant=settings.tenant
    )
    if not found or context.kms is None:
        raise ProviderError(
            "PROVIDER_AUTH_FAILED",
            f"the pool's credentials secret {name!r} is gone or cannot be opened",
            retryable=False,
        )
    try:
        value = await context.kms.decrypt(found[0].sealed_value, context=f"secret:{settings.tenant}:{name}")
        parsed = json.loads(value)
    except Exception:
        raise ProviderError(
            "PROVIDER_AUTH_FAILED", f"the pool's credentials secret {name!r} is not a JSON object", retryable=False
        ) from None
    if not isinstance(parsed, dict):
        raise ProviderError(
            "PROVIDER_AUTH_FAILED", f"the pool's credentials secret {name!r} is not a JSON object", retryable=False
        )
    return parsed


async def _adapter(
    context: ModuleContext, record: InstanceRecord, adapters: Mapping[str, AdapterFactory]
) -> ProviderAdapter:
    settings = await context.store.repository(VPS).pool(record.pool_id)
    if settings is None or settings.provider is None:
        raise ProviderError("PROVIDER_INVALID", "the provider pool is no longer configured", retryable=False)
    kind = str(settings.provider["kind"])
    factory = adapters.get(kind)
    if factory is None:
        raise ProviderError("PROVIDER_INVALID", f"no adapter for provider kind {kind!r}", retryable=False)
    return factory(settings.provider, await _credentials(context, settings))


async def _note(ctx: StepContext, record: InstanceRecord, **fields: Any) -> None:
    changed = {k: v for k, v in fields.items() if getattr(record, k) != v}
    if changed:
        async with ctx.writes() as tx:
            await tx.repository(VPS).update_instance(record.id, **changed)


async def _fail(ctx: StepContext, record: InstanceRecord, reason: str, message: str) -> StepOutcome:
    outcome = StepOutcome.fail(reason, message)
    async with ctx.writes(outcome=outcome) as tx:
        failed = await tx.repository(VPS).update_instance(
            record.id, state="failed", reason=reason, message=message[:500]
        )
        if failed is not None:
            await tx.publish([event(failed, "failed", reason=reason)])
    log.info("instance %s failed at its provider: %s", record.id, reason)
    return outcome


def _step(
    name: str,
    body: Callable[[StepContext, InstanceRecord, ProviderAdapter], Any],
    adapters: Mapping[str, AdapterFactory],
) -> Step:
    async def run(ctx: StepContext) -> StepOutcome:
        record = await ctx.store.repository(VPS).get_instance(ctx.subject)
        if record is None or record.deleted_at is not None:
            return StepOutcome.next({"done": True})
        if record.spec != ctx.data.get("spec"):
            return StepOutcome.next({"superseded": True})  # a newer change has its own workflow
        if ctx.data.get("done"):
            return StepOutcome.next()
        try:
            adapter = await _adapter(ctx.context, record, adapters)
        except ProviderError as exc:
            return await _fail(ctx, record, exc.code, exc.message)
        try:
            outcome: StepOutcome = await body(ctx, record, adapter)
            return outcome
        except ProviderError as exc:
            if exc.retryable and ctx.attempt < RETRYABLE_ATTEMPTS:
                await _note(ctx, record, reason=exc.code, message=exc.message[:500])
                return StepOutcome.retry(dt.timedelta(seconds=min(30, 2**ctx.attempt)), reason=exc.code)
            return await _fail(ctx, record, exc.code, exc.message)
        except ComputeError as exc:
            # A refusal of ours (user data the provider cannot take, settings the adapter refuses): it will not
            # pass by trying again, so the instance fails with it at once instead of polling for hours.
            if exc.code == "UNAVAILABLE" and ctx.attempt < RETRYABLE_ATTEMPTS:
                return StepOutcome.retry(dt.timedelta(seconds=min(30, 2**ctx.attempt)), reason=exc.code)
            return await _fail(ctx, record, exc.code, exc.message)
        finally:
            await adapter.aclose()

    return Step(
        name=name,
        run=run,
        deadline=dt.timedelta(seconds=90),
        retry=RetryPolicy(base=dt.timedelta(seconds=2), max_delay=dt.timedelta(seconds=30), max_attempts=MAX_PASSES),
    )


async def _launch(ctx: StepContext, record: InstanceRecord, adapter: ProviderAdapter) -> StepOutcome:
    if record.provider_id is not None:
        return StepOutcome.next()
    found = await adapter.find(record.client_token)
    if found is None and record.deleting:
        outcome = StepOutcome.next({"done": True})
        async with ctx.writes(outcome=outcome) as tx:
            await finish_delete(tx, record, ctx.context.clock.now())
        return outcome
    if found is None:
        image = await ctx.store.repository(IMAGES).get(record.image_id)
        settings = await ctx.store.repository(VPS).pool(record.pool_id)
        kind = str((settings.provider or {}).get("kind")) if settings is not None else ""
        provider_image = image.provider_images.get(kind) if image is not None else None
        if provider_image is None:
            return await _fail(ctx, record, "PROVIDER_IMAGE_NOT_FOUND", f"the image has no {kind} image id")
        await _note(ctx, record, state="provisioning", step="launch", reason=None, message=None)
        found = await adapter.launch(
            LaunchRequest(
                client_token=record.client_token,
                instance_type=record.instance_type or "",
                image=provider_image,
                user_data=compose_user_data(record.user_data, record.ssh_keys, record.hostname),
                name=record.hostname,
                tags={"bettercompute:instance": record.id, "bettercompute:tenant": record.tenant},
            )
        )
    outcome = StepOutcome.next()
    async with ctx.writes(outcome=outcome) as tx:
        updated = await tx.repository(VPS).update_instance(
            record.id,
            provider_id=found.id,
            state="provisioning",
            step="converge",
            reason=None,
            message=None,
            addresses=_addresses(found),
        )
        if updated is not None:
            await tx.publish([event(updated, "launched", provider_id=found.id)])
    return outcome


def _addresses(found: ProviderInstance) -> tuple[str, ...]:
    return tuple(a for a in (found.private_ip, found.public_ip) if a)


async def _converge(ctx: StepContext, record: InstanceRecord, adapter: ProviderAdapter) -> StepOutcome:
    if ctx.attempt >= MAX_PASSES:
        return await _fail(ctx, record, "PROVIDER_TIMEOUT", "the provider did not reach the wanted state in time")
    wait = StepOutcome.retry(POLL, reason="CONVERGING")
    if record.provider_id is None:
        return await _fail(ctx, record, "PROVIDER_NOT_FOUND", "the instance was never launched")
    found = await adapter.describe(record.provider_id)
    gone = found is None or found.state == "terminated"
    if record.deleting:
        if gone:
            outcome = StepOutcome.next({"done": True})
            async with ctx.writes(outcome=outcome) as tx:
                await finish_delete(tx, record, ctx.context.clock.now())
            return outcome
        assert found is not None
        if found.state != "shutting-down":
            await adapter.terminate(record.provider_id)
        await _note(ctx, record, step="terminate", reason=None, message=None)
        return wait
    if gone:
        return await _fail(ctx, record, "PROVIDER_TERMINATED", "the provider terminated the instance")
    assert found is not None
    wanted_type = record.instance_type or found.instance_type
    # A reboot is a stop, then a start: ``reboot_stop`` on the instance says the stop was asked for.
    rebooting = bool(ctx.data.get("reboot")) and record.step not in ("reboot_stop", "start")
    if found.state in ("pending", "stopping"):
        await _note(ctx, record, state="provisioning", step=f"wait_{found.state}")
        return wait
    if found.state == "running":
        if found.instance_type != wanted_type or record.power == "stopped" or rebooting:
            await adapter.stop(record.provider_id)
            await _note(ctx, record, state="provisioning", step="reboot_stop" if rebooting else "stop")
            return wait
        outcome = StepOutcome.next({"done": True})
        async with ctx.writes(outcome=outcome) as tx:
            await tx.repository(VPS).update_instance(
                record.id,
                state="running",
                step=None,
                reason=None,
                message=None,
                addresses=_addresses(found),
                observed_spec=record.spec,
            )
            if record.state != "running":
                await tx.publish([event(record, "running", provider_id=record.provider_id)])
        return outcome
    if found.state == "stopped":
        if found.instance_type != wanted_type:
            await adapter.resize(record.provider_id, wanted_type)
            await _note(ctx, record, state="provisioning", step="resize")
            return wait
        if record.power == "running":
            await adapter.start(record.provider_id)
            await _note(ctx, record, state="provisioning", step="start")
            return wait
        outcome = StepOutcome.next({"done": True})
        async with ctx.writes(outcome=outcome) as tx:
            await tx.repository(VPS).update_instance(
                record.id, state="stopped", step=None, reason=None, message=None, observed_spec=record.spec
            )
            if record.state != "stopped":
                await tx.publish([event(record, "stopped", provider_id=record.provider_id)])
        return outcome
    await _note(ctx, record, step=f"wait_{found.state}")
    return wait


def provider_workflow(adapters: Mapping[str, AdapterFactory]) -> Workflow:
    """The ``vps-provider`` workflow, calling providers through ``adapters`` (by provider kind)."""
    return Workflow(
        name="vps-provider", steps=[_step("launch", _launch, adapters), _step("converge", _converge, adapters)]
    )


PROVIDER = provider_workflow({})
"""The workflow's shape, for starting it (the module registers the one bound to its adapters)."""
