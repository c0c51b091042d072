"""The KMS in ``better_compute()``: the webhooks group exists only with one, and a module needing one is refused
without it (``INVALID_CONFIG`` naming ``kms``)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import attrs
import pytest

from bettercompute import LocalKeyKms, Options, better_compute
from bettercompute.errors import InvalidConfigError
from bettercompute.modules.webhooks import WebhookSettings

from ..core._echo import EchoModule
from ..core.conftest import make_compute, make_iam


@attrs.frozen(kw_only=True)
class SecretKeepingModule(EchoModule):
    requires: tuple[str, ...] = ("kms",)


def _problems(options: Options) -> list[str]:
    with pytest.raises(InvalidConfigError) as info:
        better_compute(options)
    problems: list[str] = info.value.details["problems"]
    return problems


def test_the_webhooks_sender_comes_with_a_kms_and_the_group_is_there_either_way(tmp_path: Path) -> None:
    without = make_compute()
    assert without.registry.owner("webhooks") == "webhooks"  # its calls answer FAILED_PRECONDITION, naming the KMS
    assert "sinks/webhooks" not in [job.lease_name for job in without.jobs.all]
    with_kms = make_compute(kms=LocalKeyKms(tmp_path / "k"))
    assert with_kms.registry.owner("webhooks") == "webhooks"
    assert "sinks/webhooks" in [job.lease_name for job in with_kms.jobs.all]
    assert not (tmp_path / "k").exists()  # better_compute() does no I/O


def test_a_module_that_keeps_secrets_needs_a_kms() -> None:
    store = make_compute().context.store
    problems = _problems(Options(store=store, iam=make_iam(), modules=[SecretKeepingModule()]))
    assert len(problems) == 1 and problems[0].startswith("kms: module 'echo'")


def test_a_kms_without_its_methods_and_bad_settings_are_refused(tmp_path: Path) -> None:
    store = make_compute().context.store
    problems = _problems(
        Options(store=store, iam=make_iam(), kms=object(), webhooks=WebhookSettings(max_attempts=0))  # type: ignore[arg-type]
    )
    assert any(p.startswith("kms: object lacks encrypt, decrypt") for p in problems)
    assert any(p.startswith("webhooks.max_attempts") for p in problems)


def test_a_module_may_not_take_the_name_webhooks(tmp_path: Path) -> None:
    store = make_compute().context.store
    problems = _problems(
        Options(store=store, iam=make_iam(), kms=LocalKeyKms(tmp_path / "k"), modules=[EchoModule(name="webhooks")])
    )
    assert problems == ["modules[0]: the name 'webhooks' is used twice"]


def test_finished_deliveries_are_kept_a_week_and_dead_letters_a_month_by_default() -> None:
    settings = WebhookSettings()
    assert settings.retention == dt.timedelta(days=7)
    assert settings.dead_retention == dt.timedelta(days=30)
    assert settings.problems() == []


@pytest.mark.parametrize("field", ["retention", "dead_retention"])
@pytest.mark.parametrize("value", [dt.timedelta(0), dt.timedelta(seconds=-1), dt.timedelta(days=36526)])
def test_a_retention_that_is_not_positive_or_absurdly_long_is_refused(
    field: str, value: dt.timedelta, tmp_path: Path
) -> None:
    changes: dict[str, Any] = {field: value}
    settings = attrs.evolve(WebhookSettings(), **changes)
    problem = f"webhooks.{field}: must be positive and at most 100 years"
    assert settings.problems() == [problem]
    store = make_compute().context.store
    kms = LocalKeyKms(tmp_path / "k")
    assert _problems(Options(store=store, iam=make_iam(), kms=kms, webhooks=settings)) == [problem]
