"""The inventory module is registered with node identity, and the acceptance checks other modules declare reach it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from bettercompute import JoinSettings, LocalKeyKms
from bettercompute.errors import FailedPreconditionError, InvalidConfigError
from bettercompute.modules.inventory import AcceptanceCheck, InventoryModule

from ..core._echo import EchoModule
from ..core.conftest import make_compute

JOIN = JoinSettings(gateway_address="gw.example.com:443", trust_domain="example.com")


def _burn_in(result: Any, policy: Any) -> list[dict[str, Any]]:
    return [] if result.get("passed") else [{"reason": "burn_in_failed", "uuid": None, "value": None}]


@attrs.define
class BurnInModule(EchoModule):
    acceptance_checks: tuple[Any, ...] = (AcceptanceCheck(kind="burn.in", judge=_burn_in),)


def _inventory(compute: Any) -> InventoryModule:
    [found] = [m for m in compute._modules if isinstance(m, InventoryModule)]
    return found


def test_a_module_adds_an_acceptance_check_next_to_diag_nvml(tmp_path: Path) -> None:
    compute = make_compute(modules=[BurnInModule()], join=JOIN, kms=LocalKeyKms(tmp_path / "k"))
    assert _inventory(compute).controllers.checks == ["burn.in", "diag.nvml"]
    kinds = {r.kind for r in compute.jobs.reconcilers}
    assert {"inventory", "node-lifecycle"} <= kinds


def test_without_node_identity_the_inventory_module_is_there_and_the_gateway_services_say_what_they_need() -> None:
    compute = make_compute()
    assert _inventory(compute).controllers.checks == ["diag.nvml"]
    with pytest.raises(FailedPreconditionError, match=r"needs Options\.join and Options\.kms"):
        _ = compute.gateway_services


def test_an_acceptance_check_that_is_not_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigError) as refused:
        make_compute(modules=[BurnInModule(acceptance_checks=("burn.in",))], join=JOIN, kms=LocalKeyKms(tmp_path / "k"))
    assert any("acceptance_checks" in p for p in refused.value.details["problems"])
