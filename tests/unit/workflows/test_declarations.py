"""Workflow declarations: what a Workflow, a Step and a StepOutcome accept, and how a control plane takes them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pytest

from bettercompute import BetterCompute, Job, Options, Step, StepContext, StepOutcome, Workflow, better_compute
from bettercompute._runtime.workflows import PASS_MARGIN, WORKFLOW_KIND
from bettercompute.errors import InvalidConfigError, InvalidInputError
from bettercompute.ports import Migration
from bettercompute_iam import EmbeddedIam
from bettercompute_store_pg import PgStore


async def _next(ctx: StepContext) -> StepOutcome:
    return StepOutcome.next()


ALL = (
    Workflow(name="one", steps=(Step(name="a", run=_next),)),
    Workflow(
        name="two", steps=(Step(name="a", run=_next, deadline=dt.timedelta(seconds=3)), Step(name="b", run=_next))
    ),
)


@attrs.frozen(kw_only=True)
class FlowsModule:
    workflows: Sequence[Any]
    name: str = "flows"
    version: str = "0.1.0"
    core_range: str = ">=0.1"
    groups: Sequence[Any] = ()
    actions: Sequence[str] = ()
    migrations: Mapping[str, Sequence[Migration]] = attrs.field(factory=dict)
    jobs: Sequence[Job] = ()

    async def start(self, context: Any) -> None:
        return None

    async def stop(self) -> None:
        return None


def _compute(*workflows: object) -> BetterCompute:
    store = PgStore("postgresql://nobody@127.0.0.1:1/none")
    return better_compute(Options(store=store, iam=EmbeddedIam(), modules=[FlowsModule(workflows=workflows)]))


def test_a_workflow_needs_steps_with_unique_names_and_positive_deadlines() -> None:
    with pytest.raises(ValueError, match="at least one step"):
        Workflow(name="empty", steps=())
    with pytest.raises(ValueError, match="unique"):
        Workflow(name="twice", steps=(Step(name="a", run=_next), Step(name="a", run=_next)))
    with pytest.raises(ValueError, match="deadline"):
        Step(name="a", run=_next, deadline=dt.timedelta(0))
    flow = Workflow(name="ok", steps=[Step(name="a", run=_next), Step(name="b", run=_next)])
    assert isinstance(flow.steps, tuple)
    assert flow.index("b") == 1


def test_step_outcomes_check_what_they_are_given() -> None:
    assert StepOutcome.next({"a": 1}).data == {"a": 1}
    wait = StepOutcome.wait("done", timeout=dt.timedelta(minutes=5), on_timeout="next")
    assert (wait.action, wait.event, wait.on_timeout) == ("wait", "done", "next")
    with pytest.raises(InvalidInputError):
        StepOutcome.wait("")
    with pytest.raises(InvalidInputError):
        StepOutcome.wait("done", on_timeout="ignore")
    with pytest.raises(InvalidInputError):
        StepOutcome.wait("done", timeout=dt.timedelta(0))
    with pytest.raises(InvalidInputError):
        StepOutcome.fail("has spaces in it")
    with pytest.raises(InvalidInputError):
        StepOutcome.retry(reason="")
    assert StepOutcome.fail("NO_DISKS", "none").reason == "NO_DISKS"


def test_the_engine_is_a_controllers_reconciler_only_when_workflows_are_declared() -> None:
    compute = _compute(*ALL)
    assert compute.workflows.types == sorted(w.name for w in ALL)
    reconciler = compute.workflows.reconciler
    assert (reconciler.kind, reconciler.role) == (WORKFLOW_KIND, "controllers")
    assert reconciler.deadline == dt.timedelta(seconds=30) + PASS_MARGIN  # the longest step's, plus the margin
    assert reconciler in compute.jobs.reconcilers
    assert all(r.kind != WORKFLOW_KIND for r in _compute().jobs.reconcilers)


def test_misdeclared_workflows_are_refused() -> None:
    with pytest.raises(InvalidConfigError) as raised:
        _compute(ALL[0], ALL[0], "not a workflow")
    problems = raised.value.details["problems"]
    assert any("declared twice" in p for p in problems)
    assert any("is not a bettercompute.Workflow" in p for p in problems)
