"""The optimizer-step group: ``optimizer_impl``, the kernels the script's own optimizer runs.

The same update as the script's, in fewer kernels (:mod:`perfscope.runtime.optimizer_impl`):
it serves the ``launch`` share (one launch per tensor and operation becomes one per group) and
the ``compute`` share (the fused kernel makes one pass over each tensor's parameter, gradient and
state instead of one per operation; on the CPU, where PyTorch never picks anything but the
for-loop, the per-operator dispatch is most of a small model's optimizer step). The update's math
is the same up to the order of floating-point operations, which the numerics guard watches.
"""

from __future__ import annotations

from perfscope.record.run_facts import RunFacts
from perfscope.runtime.groups.base import KnobGroup, Knob, SearchPart, categorical, record

SERVES = ("launch", "compute")
# A first guess switches only an optimizer with this many parameter tensors or more: below it the
# for-loop's per-tensor work is too small a part of any step to be the one the verdict names.
MANY_TENSORS = 32
NO_OPTIMIZER = "the run showed no torch.optim optimizer step"
REPLACED = "the optimizer key replaced the script's optimizer (LAMB/LARS have one implementation)"


class OptimizerStepGroup(KnobGroup):
    """``optimizer_impl``."""

    name = "optimizer-step"
    keys = ("optimizer_impl",)
    title = "the optimizer's kernels (for-loop, foreach, fused)"

    # --- perfscope.accelerate -----------------------------------------------------------------

    def apply(self, acc) -> None:
        impl = acc.config.optimizer_impl
        if impl is None:
            return
        if acc.optimizer is None:
            acc.skipped["optimizer_impl"] = "no optimizer given to accelerate()"
            return
        if "optimizer" in acc.applied:
            acc.skipped["optimizer_impl"] = REPLACED
            return
        from perfscope.runtime.optimizer_impl import switch

        record(acc, "optimizer_impl", *switch(acc.optimizer, impl))

    # --- launch-time patching -----------------------------------------------------------------

    def launch_plan(self, config, report) -> None:
        if config.optimizer_impl is not None:
            report.applied["optimizer_impl"] = (f"{config.optimizer_impl} step for the script's optimizer "
                                                "(its param groups' flags, set before its first step)")

    def launch_patches(self, config, report) -> list:
        impl = config.optimizer_impl
        if impl is None:
            return []
        from perfscope.runtime.optimizer_impl import before_first_step, switch

        switched = []  # the first optimizer that switched: a later one that refuses does not hide it

        def apply(optimizer) -> None:
            done, why = switch(optimizer, impl)
            if done:
                switched.append(done)
                report.not_applied.pop("optimizer_impl", None)
                report.applied["optimizer_impl"] = switched[0]
            elif not switched:
                report.applied.pop("optimizer_impl", None)
                report.not_applied["optimizer_impl"] = why

        return [before_first_step(apply)]

    # --- the tuner ----------------------------------------------------------------------------

    def observed(self, facts: RunFacts) -> dict:
        return {"optimizer_impl": facts.optimizer.impl if facts.optimizer else None}

    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        part = SearchPart()
        seen = facts.optimizer
        if seen is None:
            part.exclude("optimizer_impl", NO_OPTIMIZER)
            return part
        impls = list(seen.impls or [seen.impl])
        if len(impls) < 2:
            part.exclude("optimizer_impl", f"the script's {seen.class_} has no other implementation "
                                           "it can run with these parameters")
            return part
        part.knobs.append(Knob("optimizer_impl", SERVES, categorical(impls), impls[0]))
        return part

    def guess(self, verdict, bottlenecks, facts, fractions, cpu, params, put) -> None:
        """launch or compute, and a for-loop step over many tensors (:data:`MANY_TENSORS`): the
        fastest implementation the optimizer allows (fused, else foreach: the order PyTorch's
        documentation gives)."""
        seen = facts.optimizer
        if not ({"launch", "compute"} & bottlenecks) or seen is None or seen.impl != "for-loop":
            return
        if seen.tensors < MANY_TENSORS:
            return
        for best in ("fused", "foreach"):
            if best in seen.impls:
                put("optimizer_impl", best)
                return
