"""The batch group: ``batch_size`` of the script's DataLoader and ``lr_scaling``, its learning-rate
rule (:mod:`perfscope.runtime.batch`).

A larger batch means fewer optimizer steps, launches and all-reduces per sample: it serves the
``launch`` and ``comm`` shares. It changes what is trained, so it is searched (never put in the
rule-based guess unasked, as the large-batch optimizer is not) and the numerics guard compares its
loss with the baseline's at the same number of samples seen. How far it may go is the memory the
baseline left: each searched size must fit ``MEMORY_USE`` of the device's (or host's) capacity
with the whole measured peak scaled by the factor -- an upper bound, since the weights and the
optimizer's state do not grow with the batch.
"""

from __future__ import annotations

import contextlib

from perfscope.record.run_facts import MemoryFacts, RunFacts
from perfscope.runtime.groups.base import KnobGroup, Knob, SearchPart, categorical

SERVES = ("launch", "comm")
FACTORS = (2, 4)
MEMORY_USE = 0.85  # of the capacity: the allocator's fragmentation and the run's spikes need the rest
NO_LOADER = "the script builds no torch DataLoader (none was iterated): its batch size cannot be found"
RULE = "the learning-rate rule is the user's choice (linear scaling with warm-up unless the config says otherwise)"


def allowed_factors(memory: MemoryFacts | None) -> tuple[list[int], str | None]:
    """The factors of :data:`FACTORS` the baseline's memory allows, and why the others are not
    (None when all are). ``memory``: the baseline's ``peak_bytes`` and ``capacity_bytes``."""
    peak, capacity = (memory.peak_bytes, memory.capacity_bytes) if memory is not None else (None, None)
    if not peak or not capacity:
        return [], "the baseline's memory peak was not measured, so a larger batch's could not be bounded"
    ok = [k for k in FACTORS if peak * k <= MEMORY_USE * capacity]
    if len(ok) == len(FACTORS):
        return ok, None
    return ok, (f"the baseline's memory peak ({peak / 2**30:.2f} GiB of {capacity / 2**30:.2f} GiB) leaves room for "
                f"{'x' + str(ok[-1]) if ok else 'no larger batch'} within {MEMORY_USE:.0%} of the capacity")


class BatchGroup(KnobGroup):
    """``batch_size``, ``lr_scaling``."""

    name = "batch"
    keys = ("batch_size", "lr_scaling")
    title = "batch size (with the learning-rate rule)"

    # --- perfscope.accelerate -----------------------------------------------------------------

    def apply(self, acc) -> None:
        cfg = acc.config
        if cfg.batch_size is None:
            if "lr_scaling" in self.changed(cfg):
                acc.skipped["lr_scaling"] = "only used with batch_size"
            return
        from torch.utils.data import DataLoader

        from perfscope.runtime import batch
        from perfscope.runtime.data import rebuild_loader

        loader = acc.loader
        if loader is None:
            acc.skipped["batch_size"] = "no loader given to accelerate()"
            return
        if type(loader) is not DataLoader:
            acc.skipped["batch_size"] = f"the loader is a {type(loader).__name__}, not a torch DataLoader"
            return
        why = batch.why_not(loader.batch_size, loader.batch_size is None)
        if why is not None:
            acc.skipped["batch_size"] = why
            return
        k = batch.factor_of(loader.batch_size, cfg.batch_size)
        acc.loader = rebuild_loader(loader, batch_size=cfg.batch_size)
        acc.applied["batch_size"] = f"DataLoader rebuilt with batch_size={cfg.batch_size} (was {loader.batch_size})"
        if acc.optimizer is None:
            acc.skipped["lr_scaling"] = "no optimizer given to accelerate(): the learning rate is the script's"
            return
        batch.ScaledLr(cfg.lr_scaling, k).attach(acc.optimizer)
        acc.applied["lr_scaling"] = batch.rule_text(cfg.lr_scaling, k)

    # --- launch-time patching -----------------------------------------------------------------

    def launch_plan(self, config, report) -> None:
        if config.batch_size is not None:
            report.applied["batch_size"] = f"DataLoader(batch_size={config.batch_size}) for loaders the script builds"
            report.applied["lr_scaling"] = f"{config.lr_scaling} learning-rate rule on every optimizer step"

    def launch_patches(self, config, report) -> list:
        if config.batch_size is None:
            return []
        return [_LaunchBatch(config, report).patch()]

    # --- the tuner ----------------------------------------------------------------------------

    def observed(self, facts: RunFacts) -> dict:
        return {"batch_size": facts.dataloader.batch_size if facts.dataloader else None, "lr_scaling": "linear"}

    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        part = SearchPart()
        part.exclude("lr_scaling", RULE)
        loader = facts.dataloader
        if loader is None:
            part.exclude("batch_size", NO_LOADER)
            return part
        base = loader.batch_size
        if not base:
            part.exclude("batch_size", "the DataLoader has no batch_size to change (its own batch_sampler, or "
                                       "batch_size=None)")
            return part
        factors, why = allowed_factors(facts.memory)
        if not factors:
            part.exclude("batch_size", why)
            return part
        part.knobs.append(Knob("batch_size", SERVES, categorical([base, *(base * k for k in factors)]), base))
        if why is not None:
            for k in FACTORS:
                if k not in factors:
                    part.exclude(f"batch_size={base * k}", why)
        return part


class _LaunchBatch:
    """The DataLoader patch and the learning-rate hooks of an unmodified script: the first loader
    with automatic batching sets ``k``; the rule rides on every optimizer step from then on."""

    def __init__(self, config, report) -> None:
        from perfscope.runtime.batch import ScaledLr

        self.config, self.report = config, report
        self.scaled = ScaledLr(config.lr_scaling, 1.0)  # k = 1 until a loader is changed

    @contextlib.contextmanager
    def patch(self):
        """Install both for a ``with`` block (nothing is installed before it is entered)."""
        from torch.utils.data import DataLoader

        from perfscope.runtime.constructors import patch_init

        with self.scaled.everywhere(), patch_init(DataLoader, self.adjust):
            yield

    def adjust(self, arguments: dict, signature):
        from perfscope.runtime.batch import factor_of, rule_text, why_not

        new = self.config.batch_size
        old = arguments.get("batch_size", signature.parameters["batch_size"].default)
        why = why_not(old, arguments.get("batch_sampler") is not None)
        if why is not None:
            if self.scaled.k == 1.0:
                self.report.applied.pop("batch_size", None)
                self.report.applied.pop("lr_scaling", None)
                self.report.not_applied["batch_size"] = why
            return None
        if old == new:
            return None
        arguments["batch_size"] = new
        if self.scaled.k == 1.0:  # the first loader changed decides the factor
            self.scaled.k = factor_of(old, new)
            self.report.not_applied.pop("batch_size", None)
            self.report.applied["batch_size"] = f"DataLoader batch_size={new} (was {old})"
            self.report.applied["lr_scaling"] = rule_text(self.config.lr_scaling, self.scaled.k)

        def finish(loader) -> dict:
            return {"batch_size": new}

        return finish
