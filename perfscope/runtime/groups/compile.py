"""The compile group: ``compile``, the ``torch.compile`` mode of the script's model.

Compiling fuses the model's operators into fewer, larger kernels (``launch`` and ``compute``
shares) and, with ``reduce-overhead``, replays the step's launches as CUDA graphs (``launch``).
It runs after the communication and accumulation groups, so that ``perfscope.accelerate``
compiles the model as the script will call it (the DistributedDataParallel wrapper, where there
is one: PyTorch's DDP optimizer then splits the graph at the buckets). The compile time is paid
in the first steps; the tuner counts it against the gain (:mod:`perfscope.tuner.startup`).
"""

from __future__ import annotations

from perfscope.record.run_facts import RunFacts
from perfscope.runtime.groups.base import NO_MODEL, KnobGroup, Knob, SearchPart, categorical, on_first_model, record

SERVES = ("launch", "compute")


class CompileGroup(KnobGroup):
    """``compile``."""

    name = "compile"
    keys = ("compile",)
    title = "torch.compile (inductor, CUDA graphs)"

    # --- perfscope.accelerate -----------------------------------------------------------------

    def apply(self, acc) -> None:
        mode = acc.config.compile
        if mode == "off":
            return
        from perfscope.runtime.compiling import compile_forward

        record(acc, "compile", *compile_forward(acc.model, mode))

    # --- launch-time patching -----------------------------------------------------------------

    def launch_plan(self, config, report) -> None:
        if config.compile != "off":
            report.applied["compile"] = f"torch.compile (mode {config.compile}) of the first model the script calls"

    def launch_patches(self, config, report) -> list:
        mode = config.compile
        if mode == "off":
            return []
        from perfscope.runtime.compiling import compile_forward

        # that first call runs eagerly; the compiled forward from the next one
        return [on_first_model("compile", lambda model: compile_forward(model, mode), report)]

    # --- the tuner ----------------------------------------------------------------------------

    def observed(self, facts: RunFacts) -> dict:
        return {"compile": "off"} if not (facts.model and facts.model.compiled) else {}

    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        part = SearchPart()
        model = facts.model
        if model is None:
            part.exclude("compile", NO_MODEL)
        elif model.compiled:
            part.exclude("compile", "the script compiles its model itself")
        elif facts.compiler.unavailable:
            part.exclude("compile", facts.compiler.unavailable)
        elif facts.cuda:
            part.knobs.append(Knob("compile", SERVES, categorical(
                ["off", "default", "reduce-overhead", "max-autotune-no-cudagraphs"]), "off"))
        else:
            part.knobs.append(Knob("compile", SERVES, categorical(["off", "default"]), "off"))
            part.exclude("compile=reduce-overhead", "CUDA graphs need a GPU")
            part.exclude("compile=max-autotune-no-cudagraphs", "its autotuning benchmarks GPU kernel configurations")
        return part

    def guess(self, verdict, bottlenecks, facts, fractions, cpu, params, put) -> None:
        """launch: compile (with CUDA graphs on a GPU: the standard remedy for a launch-bound step,
        PyTorch's performance tuning guide); the compile time is weighed against the gain when
        the winner is proven."""
        model = facts.model
        if "launch" not in bottlenecks or model is None or model.compiled or facts.compiler.unavailable:
            return
        put("compile", "reduce-overhead" if facts.cuda else "default")
