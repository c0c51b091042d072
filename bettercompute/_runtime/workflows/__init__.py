"""Workflows: named sequences of steps persisted in the store, run by one reconciler on the same sharded queue.

A workflow is one row (``ports.WorkflowRecord``: its current step, attempts, reason, data, wait) plus a step log.
The engine is a ``Reconciler`` of kind ``workflow`` keyed by workflow id, so a workflow is worked on only by the
worker holding its shard's lease, one pass at a time, and every write is fenced by that lease.

No network I/O inside a transaction, by structure: a step writes only inside ``async with ctx.writes() as tx:``, a
transaction fenced by the shard lease that commits when the block ends, so the step's outside calls (an HTTP call, a
BMC command) happen before or after a block, never while it holds a connection and the lease's share lock. A step may
have several blocks (say: write "powering on", call the BMC, write "on"); they do not nest. The step's outcome (the
workflow's next step, its data) is recorded with its last block when the step names it there
(``ctx.writes(outcome=...)``), else by the engine in a fenced transaction of its own once the step returns.

Effects once: a worker dying inside a block leaves none of its writes, and the step runs again, as the same attempt,
on whichever worker owns the shard next; a last block that carries the outcome commits both or neither. A step
whose blocks commit before its outcome (several blocks, or none carrying it) is run again after a crash between them,
so those writes must be repeat-safe (an upsert, a conditional update). Outside calls are never atomic with the
database: they pass ``ctx.idempotency_key`` (workflow id, step, attempt) so that a repeat is recognised there. An
exception leaving a block rolls that block back and fails the attempt; blocks that ended before it stay committed.

Waits hold no worker: a step returning ``StepOutcome.wait(event)`` parks the workflow (no due work item, or one at
its timeout); ``Workflows.signal`` stores the event's payload and enqueues the workflow, which then goes on with the
next step, the payload in its data under the event's name.
"""

from bettercompute._runtime.workflows.context import StepContext as StepContext
from bettercompute._runtime.workflows.context import StepOutcome as StepOutcome
from bettercompute._runtime.workflows.definitions import PASS_MARGIN as PASS_MARGIN
from bettercompute._runtime.workflows.definitions import WORKFLOW_KIND as WORKFLOW_KIND
from bettercompute._runtime.workflows.definitions import Step as Step
from bettercompute._runtime.workflows.definitions import Workflow as Workflow
from bettercompute._runtime.workflows.engine import Workflows as Workflows
from bettercompute._runtime.workflows.engine import signal_in as signal_in
from bettercompute._runtime.workflows.engine import start_in as start_in

__all__ = [
    "PASS_MARGIN",
    "WORKFLOW_KIND",
    "Step",
    "StepContext",
    "StepOutcome",
    "Workflow",
    "Workflows",
    "signal_in",
    "start_in",
]
