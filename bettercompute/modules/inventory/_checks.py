"""Acceptance checks: a command a node's daemon runs, and how its result is judged against the pool's
``NodePolicy``. ``diag.nvml`` is built in; a module adds its own by declaring ``acceptance_checks``.

The gate judges NVML's facts, never the daemon's one-word verdict (``healthy``): uncorrectable ECC errors over the
pool's threshold, a fatal XID (by default 48, 63, 64, 74, 79 and 92 to 95), pages pending retirement, a recovery
action NVML asks for, a GPU NVML could not read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from bettercompute.modules.pools import NodePolicy

__all__ = ["DIAG_NVML", "AcceptanceCheck", "Finding", "judge_nvml"]

Finding = dict[str, Any]
"""One reason a check failed: ``{"reason": "ecc_uncorrectable" | "xid_79" | ..., "uuid": the GPU or None, "value"}``."""


@attrs.frozen(kw_only=True)
class AcceptanceCheck:
    """A check named in a pool's ``acceptance_checks``: the command ``kind`` the daemon runs (with ``arguments``), and
    ``judge(result, policy)``, the findings that fail the node (none: it passes)."""

    kind: str
    judge: Callable[[Mapping[str, Any], NodePolicy], list[Finding]]
    arguments: Mapping[str, Any] = attrs.field(factory=dict)
    deadline: dt.timedelta | None = None
    """How long the daemon has (the pool's ``check_deadline_seconds`` when ``None``)."""


def _number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def judge_nvml(result: Mapping[str, Any], policy: NodePolicy) -> list[Finding]:
    """The findings of a ``diag.nvml`` result (``{"health": ..., "fake": ...}``) under ``policy``."""
    health = result.get("health")
    if not isinstance(health, Mapping):
        return [{"reason": "malformed_result", "uuid": None, "value": None}]
    findings: list[Finding] = []
    gpus = health.get("gpus")
    if isinstance(gpus, list) and gpus:
        for gpu in gpus:
            if not isinstance(gpu, Mapping):
                findings.append({"reason": "malformed_result", "uuid": None, "value": None})
                continue
            uuid = gpu.get("uuid") if isinstance(gpu.get("uuid"), str) else None
            raw_problems = gpu.get("problems")
            problems: list[Any] = raw_problems if isinstance(raw_problems, list) else []
            ecc = _number(gpu.get("ecc_uncorrectable"))
            if ecc > policy.max_ecc_uncorrectable:
                findings.append({"reason": "ecc_uncorrectable", "uuid": uuid, "value": ecc})
            if policy.quarantine_retired_pages_pending and gpu.get("retired_pages_pending") is True:
                findings.append({"reason": "retired_pages_pending", "uuid": uuid, "value": True})
            action = gpu.get("recovery_action")
            if policy.quarantine_recovery_action and isinstance(action, str) and action != "none":
                findings.append({"reason": "recovery_action", "uuid": uuid, "value": action[:64]})
            if "unreadable" in problems:
                findings.append({"reason": "gpu_unreadable", "uuid": uuid, "value": None})
    else:
        # A declared (fake) health gives the node's totals only.
        ecc = _number(health.get("ecc_uncorrectable"))
        if ecc > policy.max_ecc_uncorrectable:
            findings.append({"reason": "ecc_uncorrectable", "uuid": None, "value": ecc})
        if policy.quarantine_retired_pages_pending and health.get("retired_pages_pending") is True:
            findings.append({"reason": "retired_pages_pending", "uuid": None, "value": True})
    xids = health.get("xid")
    if isinstance(xids, list):
        fatal = set(policy.fatal_xids)
        for seen in xids:
            xid = seen.get("xid") if isinstance(seen, Mapping) else seen
            if isinstance(xid, int) and not isinstance(xid, bool) and xid in fatal:
                uuid = seen.get("uuid") if isinstance(seen, Mapping) and isinstance(seen.get("uuid"), str) else None
                findings.append({"reason": f"xid_{xid}", "uuid": uuid, "value": xid})
    return findings


DIAG_NVML = AcceptanceCheck(kind="diag.nvml", judge=judge_nvml)
"""The built-in check: the daemon reads NVML again (the declared health on a machine with a fake inventory)."""
