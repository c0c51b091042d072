"""Workflow types: a name and its steps, each with a deadline, a retry policy and an optional compensation."""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs

from bettercompute._runtime.reconcile import RetryPolicy

if TYPE_CHECKING:
    pass

from bettercompute._runtime.workflows.context import StepContext, StepOutcome

__all__ = ["ACTIVE", "TERMINAL", "WORKFLOW_KIND", "Compensate", "Step", "StepRun", "Workflow"]

WORKFLOW_KIND = "workflow"
"""The work item kind of the workflow engine; the key is the workflow id."""

ACTIVE = frozenset({"running", "waiting", "cancelling"})
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

PASS_MARGIN = dt.timedelta(seconds=5)
"""What one engine pass may take beyond its longest step: reading the workflow and committing its progress."""
MAX_STEPS_PER_PASS = 50


def _positive(instance: Any, attribute: Any, value: dt.timedelta) -> None:
    if value <= dt.timedelta(0):
        raise ValueError(f"{attribute.name} must be positive")


StepRun = Callable[[StepContext], Awaitable[StepOutcome]]
Compensate = Callable[[StepContext], Awaitable[None]]


@attrs.frozen(kw_only=True)
class Step:
    """One step of a workflow.

    Args:
        name: Unique within the workflow (it names the step in the log and in ``WorkflowRecord.step``).
        run: ``async (ctx) -> StepOutcome``; raising (or overrunning ``deadline``) is a failed attempt, retried per
            ``retry``; the last failure fails the workflow with the reason (an error code, ``DEADLINE_EXCEEDED`` or
            ``EXCEPTION:<type>``).
        deadline: How long one attempt may run.
        retry: Backoff between attempts and how many to make.
        compensate: ``async (ctx) -> None``, run on cancellation if the step had completed, undoing its effect.
    """

    name: str
    run: StepRun
    deadline: dt.timedelta = attrs.field(default=dt.timedelta(seconds=30), validator=_positive)
    retry: RetryPolicy = attrs.field(factory=RetryPolicy)
    compensate: Compensate | None = None


def _tuple(steps: Iterable[Step]) -> tuple[Step, ...]:
    return tuple(steps)


def _steps(instance: Any, attribute: Any, value: tuple[Step, ...]) -> None:
    if not value:
        raise ValueError("a workflow needs at least one step")
    names = [s.name for s in value]
    if len(set(names)) != len(names):
        raise ValueError("step names must be unique within a workflow")


@attrs.frozen(kw_only=True)
class Workflow:
    """A workflow type: a name (unique in the control plane) and its steps, run in order.

    Modules declare theirs in an optional ``workflows`` attribute; ``compute.workflows.start(name, ...)`` starts one.
    """

    name: str
    steps: tuple[Step, ...] = attrs.field(converter=_tuple, validator=_steps)

    def index(self, step: str) -> int:
        """The position of the named step."""
        return [s.name for s in self.steps].index(step)
