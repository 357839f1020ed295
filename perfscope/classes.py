"""The bottleneck classes: one table, from which the verdict, the partition's costs, the step time's
what-ifs and every renderer derive (``docs/metrics.md``, Classification).

Each :class:`BottleneckClass` row says, for GPU and CPU-only traces, which per-step columns make
its cost, what it means, what removing it means and what to change; its threshold (None for
compute: the verdict when no removable class reaches its own), its title and colour in the
report, and where it stands in the charts. ``other`` (GPU idle that no single knob removes) is a
part of the step with a colour and columns, but names no verdict: :data:`OTHER`.

Thresholds (fraction of step time): io 0.10 and comm 0.10 follow the TensorBoard profiler
plugin's advice triggers (DataLoader above 5% of a step, unhidden communication above 10%),
raised to 10% for io so that a verdict needs twice the evidence of a hint. Launch is 0.25: its
fixes (CUDA graphs, torch.compile, a larger batch) change the program rather than a setting, and
eager PyTorch leaves a fifth of a well-fed step in host-launch gaps (17-22% on the plugin's
ResNet-50 sample with ``num_workers=4``, whose GPU is busy 70% of the time); only when the GPU
waits on the host for a quarter of the step or more does launch overhead, rather than the math,
set the pace.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class BottleneckClass:
    """One class of the table.

    Attributes:
        name: ``io``, ``comm``, ``launch``, ``compute`` (``{name}-bound`` is the verdict).
        threshold: Fraction of step time its cost must reach to name the verdict; None for the
            class named when no other does (compute).
        costs: Per mode (``gpu``, ``cpu``), the per-step columns (µs) whose sum is its cost.
        means: Per mode, what the class means, for the report's verdict section.
        removal: Per mode, what removing it means, as the start of a what-if sentence (absent for
            compute, which no knob removes).
        advice: Per mode, what to change.
        knobs: Per mode, the configuration keys (``perfscope profile --config``, ``perfscope
            tune``) that the advice names, in its order; each is a key whose knob group's search
            says it serves this class (``tests/test_knob_groups.py`` holds the two together).
        title: The report's heading of its recommendation.
        colour: Its colour's name in the report's palette (``perfscope.reports.palette``).
        chart_order: Its place in the stacked charts, bottom first.
    """

    name: str
    threshold: float | None
    costs: dict[str, tuple[str, ...]]
    means: dict[str, str] = field(default_factory=dict)
    removal: dict[str, str] = field(default_factory=dict)
    advice: dict[str, str] = field(default_factory=dict)
    knobs: dict[str, tuple[str, ...]] = field(default_factory=dict)
    title: str = ""
    colour: str = ""
    chart_order: int = 0

    @property
    def removable(self) -> bool:
        """A knob takes it out of the step (it has a threshold)."""
        return self.threshold is not None


TABLE = (
    BottleneckClass(
        name="io", threshold=0.10, colour="orange", chart_order=2, title="Feed the input pipeline",
        costs={"gpu": ("input_wait_us", "exposed_h2d_us", "h2d_wait_us"), "cpu": ("dataloader_us",)},
        means={"gpu": "the GPU waits for the next batch (DataLoader on the main thread) or for its host-to-device copy",
               "cpu": "the training thread spends its time fetching data"},
        removal={"gpu": "Removing the input wait (DataLoader wait, exposed host-to-device copies and their staging)",
                 "cpu": "Taking data loading off the training thread"},
        advice={"gpu": "Feed the GPU faster: raise DataLoader num_workers, set pin_memory=True and "
                "prefetch_factor, and copy batches with non_blocking=True (or prefetch on a side stream).",
                "cpu": "Load data off the training thread: raise DataLoader num_workers and "
                "prefetch_factor (persistent_workers=True for short epochs)."},
        knobs={"gpu": ("num_workers", "pin_memory", "prefetch_factor", "device_prefetch"),
               "cpu": ("num_workers", "prefetch_factor")},
    ),
    BottleneckClass(
        name="comm", threshold=0.10, colour="purple", chart_order=1, title="Hide communication",
        costs={"gpu": ("exposed_comm_us",), "cpu": ("exposed_comm_us",)},
        means={"gpu": "gradient communication is not hidden behind computation",
               "cpu": "the training thread waits for collectives"},
        removal={"gpu": "Hiding the exposed communication behind computation",
                 "cpu": "Hiding the exposed communication"},
        advice={"gpu": "Hide the all-reduce behind backward: tune DDP bucket_cap_mb, set "
                "gradient_as_bucket_view, compress gradients (fp16/bf16 hook), use hierarchical all-reduce "
                "across nodes, or accumulate gradients (no_sync) to reduce less often.",
                "cpu": "Reduce communication: tune DDP bucket_cap_mb, compress gradients (fp16/bf16 "
                "hook), or accumulate gradients (no_sync) to all-reduce less often."},
        knobs={"gpu": ("bucket_cap_mb", "grad_compression", "hierarchical_allreduce", "grad_accum_steps"),
               "cpu": ("bucket_cap_mb", "grad_compression", "grad_accum_steps")},
    ),
    BottleneckClass(
        name="launch", threshold=0.25, colour="sky", chart_order=3, title="Cut launch overhead",
        costs={"gpu": ("launch_wait_us", "kernel_wait_us"), "cpu": ("framework_overhead_us",)},
        means={"gpu": "the GPU waits for the host to launch work: Python, dispatch and launch overhead between many "
                      "small kernels",
               "cpu": "per-operator dispatch and Python overhead between operators dominates"},
        removal={"gpu": "Removing the launch and kernel waits (the GPU idle while the host launches)",
                 "cpu": "Removing the framework overhead between operators"},
        advice={"gpu": "Launch less often: a larger batch per step or gradient accumulation, "
                "CUDA graphs (torch.compile mode='reduce-overhead'; compile: reduce-overhead in a --config file), "
                "fused/foreach optimizers (optimizer_impl) and fused operators to cut the number of small kernels.",
                "cpu": "Cut per-operator dispatch overhead: a larger batch per step, "
                "torch.compile (compile: default in a --config file), and fused operators instead of many tiny ones."},
        knobs={"gpu": ("batch_size", "grad_accum_steps", "compile", "optimizer_impl", "fused_ops"),
               "cpu": ("batch_size", "compile", "fused_ops")},
    ),
    BottleneckClass(
        name="compute", threshold=None, colour="green", chart_order=0, title="Speed up the math itself",
        costs={"gpu": ("compute_us", "exposed_other_mem_us"), "cpu": ("operator_us",)},
        means={"gpu": "kernels keep the GPU busy: the math itself sets the pace",
               "cpu": "operators keep the cores busy: the math itself sets the pace"},
        advice={"gpu": "Make the math cheaper: AMP (bf16/fp16) to use Tensor Cores, TF32 for "
                "fp32 matmuls, cudnn.benchmark, channels_last for convolutions (channels_last: true).",
                "cpu": "Make the math cheaper: bf16 autocast on CPU, intra-op threads "
                "(torch.set_num_threads) matched to the cores, channels_last for convolutions, torch.compile."},
        knobs={"gpu": ("amp_level", "tf32", "cudnn_benchmark", "channels_last"),
               "cpu": ("amp_level", "intra_op_threads", "channels_last", "compile")},
    ),
)
# GPU idle with work queued for longer than a launch takes: a part of the step, no verdict.
OTHER = BottleneckClass(name="other", threshold=None, colour="grey", chart_order=4,
                        costs={"gpu": ("other_idle_us",), "cpu": ()})

MODES = ("gpu", "cpu")


def derive() -> None:
    """(Re)compute the views below from :data:`TABLE` (at import; a test that extends the table
    calls it, then reloads the consumers)."""
    table = TABLE
    g = globals()
    g["BY_NAME"] = {c.name: c for c in table}
    # In the verdict's order of preference among removable causes (the table's order), then compute.
    g["CLASSES"] = tuple(c.name for c in table)
    g["REMOVABLE"] = tuple(c.name for c in table if c.removable)
    g["THRESHOLDS"] = {c.name: c.threshold for c in table if c.removable}
    # Which per-step columns each class (and other) costs, by mode.
    g["COSTS"] = {mode: {c.name: c.costs[mode] for c in (*table, OTHER)} for mode in MODES}
    g["ADVICE"] = {(c.name, mode): c.advice[mode] for c in table for mode in MODES}
    g["KNOBS"] = {(c.name, mode): c.knobs.get(mode, ()) for c in table for mode in MODES}
    g["MEANING"] = {(c.name, mode): c.means[mode] for c in table for mode in MODES}
    g["REMOVAL"] = {(c.name, mode): c.removal[mode] for c in table if c.removable for mode in MODES}
    g["TITLE"] = {c.name: c.title for c in table}
    # The charts' stacking order, bottom first, other last.
    g["CHART_ORDER"] = tuple(c.name for c in sorted((*table, OTHER), key=lambda c: c.chart_order))


BY_NAME: dict[str, BottleneckClass]
CLASSES: tuple[str, ...]
REMOVABLE: tuple[str, ...]
THRESHOLDS: dict[str, float]
COSTS: dict[str, dict[str, tuple[str, ...]]]
ADVICE: dict[tuple[str, str], str]
KNOBS: dict[tuple[str, str], tuple[str, ...]]
MEANING: dict[tuple[str, str], str]
REMOVAL: dict[tuple[str, str], str]
TITLE: dict[str, str]
CHART_ORDER: tuple[str, ...]
derive()
