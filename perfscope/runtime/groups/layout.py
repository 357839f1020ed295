"""The layout group: ``channels_last``, the memory format of a convolutional model.

It serves the ``compute`` share: the convolutions take their NHWC fast paths (cuDNN's Tensor Core
kernels, oneDNN's CPU kernels) without transposes around them
(:mod:`perfscope.runtime.memory_format`). It runs before the communication group, so that
``perfscope.accelerate`` converts the model before DistributedDataParallel wraps it.
"""

from __future__ import annotations

from perfscope.record.run_facts import RunFacts
from perfscope.runtime.groups.base import NO_MODEL, KnobGroup, Knob, SearchPart, categorical, on_first_model, record

SERVES = ("compute",)


class LayoutGroup(KnobGroup):
    """``channels_last``."""

    name = "layout"
    keys = ("channels_last",)
    title = "memory format (channels-last convolutions)"

    # --- perfscope.accelerate -----------------------------------------------------------------

    def apply(self, acc) -> None:
        if not acc.config.channels_last:
            return
        from perfscope.runtime.memory_format import convert

        record(acc, "channels_last", *convert(acc.model))

    # --- launch-time patching -----------------------------------------------------------------

    def launch_plan(self, config, report) -> None:
        if config.channels_last:
            report.applied["channels_last"] = "channels-last weights and inputs for the first model the script calls"

    def launch_patches(self, config, report) -> list:
        if not config.channels_last:
            return []
        from perfscope.runtime.memory_format import convert

        return [on_first_model("channels_last", convert, report)]

    # --- the tuner ----------------------------------------------------------------------------

    def observed(self, facts: RunFacts) -> dict:
        return {"channels_last": bool(facts.model and facts.model.channels_last)}

    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        part = SearchPart()
        model = facts.model
        if model is None:
            part.exclude("channels_last", NO_MODEL)
        elif not model.convolutions:
            part.exclude("channels_last", f"no 2-D convolution in the model ({model.class_})")
        elif model.channels_last:
            part.exclude("channels_last", "the script runs its convolutions in channels-last already")
        elif facts.ddp is not None and not facts.accelerate.called:
            part.exclude("channels_last", "the script wraps its model in DistributedDataParallel itself, before "
                                          "the first forward where the conversion happens at launch: "
                                          "perfscope.accelerate converts it before wrapping")
        else:
            part.knobs.append(Knob("channels_last", SERVES, categorical([False, True]), False))
        return part

    def guess(self, verdict, bottlenecks, facts, fractions, cpu, params, put) -> None:
        """compute and a model with convolutions not yet channels-last: convert it (PyTorch's
        performance tuning guide recommends it for convolutional networks on GPUs and CPUs)."""
        model = facts.model
        if "compute" in bottlenecks and model is not None and model.convolutions and not model.channels_last:
            put("channels_last", True)
