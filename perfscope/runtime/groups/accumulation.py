"""The accumulation group: several micro-batches per optimizer step.

More work per optimizer step and per gradient all-reduce: it amortises the per-step launch
overhead (the ``launch`` share) and the all-reduce (the ``comm`` share). It changes the effective
batch, which the tuner's numerics guard watches.
"""

from __future__ import annotations

from perfscope.record.run_facts import RunFacts
from perfscope.runtime.groups.base import KnobGroup, Knob, SearchPart, categorical

ACCUM_CHOICES = (1, 2, 4)
NEEDS_LOOP = "needs perfscope.accelerate(model, optimizer, ...) and perfscope.backward in the script"


class AccumulationGroup(KnobGroup):
    """``grad_accum_steps``."""

    name = "accumulation"
    keys = ("grad_accum_steps",)
    title = "gradient accumulation"

    def apply(self, acc) -> None:
        steps = acc.config.grad_accum_steps
        if acc.optimizer is None:
            if steps > 1:
                acc.skipped["grad_accum_steps"] = "no optimizer given to accelerate()"
            return
        acc.accum_steps = steps
        if steps > 1:
            acc.applied["grad_accum_steps"] = (f"optimizer steps every {steps} micro-steps; "
                                               f"backward divides the loss by {steps}")

    def launch_plan(self, config, report) -> None:
        from perfscope.runtime.patch_report import NEEDS_ACCELERATE

        if config.grad_accum_steps != 1:  # the loop's backward and step must cooperate
            report.needs_accelerate["grad_accum_steps"] = NEEDS_ACCELERATE

    def observed(self, facts: RunFacts) -> dict:
        return {"grad_accum_steps": 1}  # a script's own accumulation is not seen: it counts as one

    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        part = SearchPart()
        if facts.accelerate.called and facts.accelerate.optimizer:
            part.knobs.append(Knob("grad_accum_steps", ("launch", "comm"), categorical(ACCUM_CHOICES),
                                   self.observed(facts)["grad_accum_steps"]))
        else:
            part.exclude("grad_accum_steps", NEEDS_LOOP)
        return part

    def guess(self, verdict, bottlenecks, facts, fractions, cpu, params, put) -> None:
        """launch or comm: 2 micro-batches per optimizer step (half the steps to launch, half the
        all-reduces: DDP's ``no_sync`` on the first micro-batch). It changes the effective batch,
        which the numerics guard watches in this trial as in every other."""
        if {"launch", "comm"} & bottlenecks:
            put("grad_accum_steps", 2)
