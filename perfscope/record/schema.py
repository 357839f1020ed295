"""The summary record's schema: one msgspec struct per object of ``summary.json``.

These structs are the one definition of the record: :func:`perfscope.record.codec.decode`
validates a file against them (types, ranges, class names), the builder's output is checked
against them in the tests, and ``docs/summary.md`` is generated from their docstrings and field
descriptions (:mod:`perfscope.record.docs`; a test fails when the page differs). Fields the
structs do not name are kept as they are when a record is read (a newer minor version may add
some), but nothing renders them.

Units: ``*_us`` microseconds, ``*_frac`` fraction of the step's ``step_time_us``, ``*_s`` seconds,
``*_bytes`` bytes.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from perfscope.classes import MODES, OTHER, TABLE
from perfscope.record.job_facts import DdpRecord, LoaderRecord

SCHEMA = "perfscope.summary"
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 2 only added fields to 1 (migrated on reading: codec.MIGRATIONS)

# Value kinds, each with the rule it checks.
Number = float  # JSON numbers (whole numbers read as floats where a float is declared)
NonNeg = Annotated[float, Meta(ge=0)]
# shares may pass 0..1 by a hair of rounding
Share = Annotated[float, Meta(ge=-1e-6, le=1 + 1e-6)]
# a class name (io-bound) or a status, never free text that could forge a line of output
Token = Annotated[str, Meta(pattern=r"^[A-Za-z0-9_.+-]{1,40}$")]
Whole = int


def _d(kind, text: str):
    """``kind`` with its description (the generated docs' "meaning" column)."""
    return Annotated[kind, Meta(description=text)]


class _Record(msgspec.Struct, kw_only=True, omit_defaults=False):
    """Base of every object of the record: fields are keyword-only and may be absent (older
    summaries lack some), so each has a default."""


# --- top-level sections ----------------------------------------------------------------------

class Schedule(_Record):
    """`run.schedule`: the profiler's schedule as `perfscope profile` ran it."""

    skip_first: Annotated[Whole | None, Meta(description='steps run before the profiler starts warming up')] = None
    warmup: Annotated[Whole | None, Meta(description='steps the profiler records but discards')] = None
    active: Annotated[Whole | None, Meta(description='steps recorded and analyzed')] = None
    max_steps: Annotated[Whole | None, Meta(description=(
        'the most steps a longer window on a busy machine may record'))] = None
    extend_s: Annotated[NonNeg | None, Meta(description=(
        'the most seconds the window may be lengthened (0: never)'))] = None
    modules: Annotated[bool | None, Meta(description=(
        '*v2*: a range was recorded around every nn.Module call of the traced steps (`--modules`)'))] = None


class WindowExtension(_Record):
    """`run.window_extension`: only where a busy machine made `profile` record more steps than
    planned (`docs/collection.md`, "A longer window on a busy machine")."""

    planned: Annotated[Whole | None, Meta(description='steps planned')] = None
    recorded: Annotated[Whole | None, Meta(description='steps recorded')] = None
    clean: Annotated[Whole | None, Meta(description='clean steps before the last recorded one')] = None
    needed: Annotated[Whole | None, Meta(description='clean steps needed')] = None
    seconds: Annotated[NonNeg | None, Meta(description='seconds spent past the planned last step')] = None
    reason: Annotated[str | None, Meta(description=(
        'why it stopped: `enough clean steps`, the time cap, the step cap, or `script ended`'))] = None


class OomBlock(_Record):
    """`run.oom.largest[]`: a live allocation when the GPU ran out of memory."""

    bytes: Annotated[NonNeg | None, Meta(description='its block')] = None
    requested_bytes: Annotated[NonNeg | None, Meta(description='what was asked for')] = None
    device: Annotated[Whole | None, Meta(description='the CUDA device')] = None
    frames: Annotated[list[str] | None, Meta(description='`file:line function` of its stack, innermost first')] = None


class Oom(_Record):
    """`run.oom` (*v2*): what held the GPU's memory when an allocation failed in `perfscope profile`
    (the caching allocator's snapshot; `docs/collection.md`, Out of memory)."""

    device: Annotated[Whole | None, Meta(description='the CUDA device')] = None
    requested_bytes: Annotated[NonNeg | None, Meta(description='the allocation that failed')] = None
    allocated_bytes: Annotated[NonNeg | None, Meta(description='allocated on the device then')] = None
    free_bytes: Annotated[NonNeg | None, Meta(description='free on the device then')] = None
    reserved_bytes: Annotated[NonNeg | None, Meta(description="the allocator's segments")] = None
    largest: Annotated[list[OomBlock] | None, Meta(description='the 20 largest live allocations')] = None


class ConfigApplied(_Record):
    """`run.config_applied`: what `perfscope profile --config` applied at launch (the patching
    report, `perfscope.runtime.patch_report.PatchReport`)."""

    applied: Annotated[dict[str, str] | None, Meta(description='knob: what it does, patched at launch')] = None
    needs_accelerate: Annotated[dict[str, str] | None, Meta(description=(
        'knob: why it waits for `perfscope.accelerate` in the script'))] = None
    not_applied: Annotated[dict[str, str] | None, Meta(description='knob: why it could not be applied')] = None
    loaders: Annotated[Whole | None, Meta(description='DataLoaders the patch configured')] = None
    ddp_modules: Annotated[Whole | None, Meta(description='DistributedDataParallel wrappers it configured')] = None
    by_accelerate: Annotated[dict[str, str] | None, Meta(description=(
        'knob: what `perfscope.accelerate` applied in the script'))] = None


class Run(_Record):
    """`run`: what was analyzed. `perfscope profile` writes the script's side (`script` ...
    `error`); `perfscope analyze` writes `source`; both write `world_size`, `devices` and
    `ranks_analyzed`."""

    script: Annotated[str | None, Meta(description='the profiled script, as given')] = None
    args: Annotated[list[str] | None, Meta(description='its arguments')] = None
    cwd: Annotated[str | None, Meta(description='the directory it ran in')] = None
    host: Annotated[str | None, Meta(description='the host name')] = None
    python: Annotated[str | None, Meta(description='Python version')] = None
    torch_version: Annotated[str | None, Meta(description='torch version')] = None
    cuda_version: Annotated[str | None, Meta(description='CUDA version (null on CPU builds)')] = None
    devices: Annotated[list[str] | None, Meta(description=(
        "device names (`analyze`: from the traces' `deviceProperties`)"))] = None
    world_size: Annotated[Whole | None, Meta(description=(
        "the job's ranks (`analyze`: the traces' `distributedInfo`, else the ranks found)"))] = None
    nproc_per_node: Annotated[Whole | None, Meta(description='ranks per node as launched')] = None
    rank: Annotated[Whole | None, Meta(description='null unless run inside a torchrun job')] = None
    schedule: Annotated[Schedule | None, Meta(description="the profiler's schedule")] = None
    started_at: Annotated[str | None, Meta(description='ISO 8601 time the script started')] = None
    duration_s: Annotated[NonNeg | None, Meta(description='seconds the script ran')] = None
    exit_code: Annotated[int | None, Meta(description="the script's exit status")] = None
    error: Annotated[str | None, Meta(description='one line, when the script failed')] = None
    oom: Annotated[Oom | None, Meta(description='*v2*: the GPU ran out of memory: what held it')] = None
    config: Annotated[dict[str, Any] | None, Meta(description=(
        '`profile --config`: the configuration the run was given, knob: value'))] = None
    config_applied: Annotated[ConfigApplied | None, Meta(description=(
        '`profile --config`: what it applied, below'))] = None
    window_extension: Annotated[WindowExtension | None, Meta(description=(
        'where the window was lengthened, below'))] = None
    source: Annotated[str | None, Meta(description='`analyze`: the path analyzed')] = None
    price_per_hour: Annotated[NonNeg | None, Meta(description=(
        '*v2*: `--price-per-hour`: USD an hour per GPU (GPU runs) or per machine (CPU runs)'))] = None
    ranks_analyzed: Annotated[Whole | None, Meta(description='ranks whose traces were analyzed')] = None


Fractions = msgspec.defstruct(
    "Fractions", [(c.name, _d(Share | None, f"the {c.name} class's share"), None) for c in (*TABLE, OTHER)],
    bases=(_Record,), module=__name__)
Fractions.__doc__ = "`overall.fractions`: each class's share of the total time of the counted steps."
StepShare = msgspec.defstruct(
    "StepShare", [(c.name + "_bound", _d(Share | None, f"steps that are {c.name}-bound"), msgspec.field(
        default=None, name=f"{c.name}-bound")) for c in TABLE],
    bases=(_Record,), module=__name__)
StepShare.__doc__ = "`overall.step_share`: fraction of counted steps with each verdict."


class Overall(_Record):
    """`overall`: the run's verdict."""

    verdict: Annotated[Token | None, Meta(description=(
        '`io-bound`, `compute-bound`, `launch-bound` or `comm-bound`; *v2*: null when no step has the '
        'evidence for one'))] = None
    provisional: Annotated[bool | None, Meta(description=(
        '*v2*: the verdict is provisional: no step had clean evidence, and the steps that waited for '
        'cores were classified with that wait taken out (`docs/metrics.md`, "Provisional verdict"); '
        "`fractions` and `step_share` are then those steps'"))] = None
    core_wait_share: Annotated[Share | None, Meta(description=(
        "*v2*: for a provisional verdict, the training thread's waits for a core as a share of those "
        "steps' wall time (null otherwise)"))] = None
    reason: Annotated[str | None, Meta(description='*v2*: why there is no verdict (null when there is one)')] = None
    other_largest: Annotated[bool | None, Meta(description=(
        '*v2*: `other` (GPU idle waiting on dependencies) is larger than every class: the verdict text '
        'says so first, with `details.other_waits`'))] = None
    runner_up: Annotated[Token | None, Meta(description='the next class by cost (null without a verdict)')] = None
    fractions: Annotated[Fractions | None, Meta(description=(
        "each class's share of the total time of the counted steps: `io`, `comm`, `launch`, `compute`, "
        '`other` (empty without a verdict)'))] = None
    step_share: Annotated[StepShare | None, Meta(description='fraction of counted steps with each verdict')] = None
    advice: Annotated[str | None, Meta(description=(
        'one line naming the knobs that address the verdict; without one, what to do to get one'))] = None
    steps_counted: Annotated[Whole | None, Meta(description=(
        'steps with status `ok` (all ranks) the verdict is taken over'))] = None
    steps_total: Annotated[Whole | None, Meta(description='*v2*: all steps')] = None
    steps_by_status: Annotated[dict[str, Number] | None, Meta(description=(
        '*v2*: how many steps have each status'))] = None
    median_step_time_us: Annotated[NonNeg | None, Meta(description=(
        "median step time of the counted steps, all ranks' rows together (null when none is)"))] = None
    mean_step_time_us: Annotated[NonNeg | None, Meta(description=(
        'mean step time of the counted steps, likewise'))] = None
    step_time_us: Annotated[NonNeg | None, Meta(description=(
        "*v2*, **the run's step time**, the figure every view states: the mean over the counted steps of "
        "the job's time of each step (its slowest rank's), i.e. the measured window over its steps, the "
        'reciprocal of throughput (`docs/metrics.md`, Step time)'))] = None
    representative_step: Annotated[Whole | None, Meta(description=(
        '*v2*, the counted step whose job time is nearest to `step_time_us` (ties: the earlier); the step'
        ' the timeline and console show'))] = None


class QualityEntry(_Record):
    """`data_quality[]` (*v2*): one entry per kind of problem, summed over the traces. The repair
    order and every reason are in `docs/metrics.md` ("Repairs")."""

    action: Annotated[str | None, Meta(description=(
        '`repaired`, `dropped`, `clipped`, `set aside`, `not read`, `truncated`, or `noted` (kept as they'
        ' are, but worth knowing)'))] = None
    reason: Annotated[str | None, Meta(description='in words')] = None
    unit: Annotated[str | None, Meta(description='`event`, `string`, `value`, `byte`, `file`, `header field`, `line` (of a whole-run record)')] = None
    count: Annotated[Number | None, Meta(description='how many units')] = None
    traces: Annotated[Number | None, Meta(description='how many traces have it')] = None
    examples: Annotated[dict[str, Number] | None, Meta(description=(
        'up to five event names, categories or field names, with counts'))] = None


class TraceQuality(_Record):
    """`traces[].data_quality[]` (*v2*): one trace's entry of a kind of problem (`docs/metrics.md`,
    "Repairs"); `data_quality[]` sums them over the traces."""

    action: Annotated[str | None, Meta(description='as `data_quality[].action`')] = None
    reason: Annotated[str | None, Meta(description='in words')] = None
    count: Annotated[Number | None, Meta(description='how many units')] = None
    unit: Annotated[str | None, Meta(description='as `data_quality[].unit`')] = None
    examples: Annotated[dict[str, Number] | None, Meta(description=(
        'up to five event names, categories or field names, with counts'))] = None


# Sparse: an object holds only what the trace holds (a field it lacks is absent, not null).
class DistributedInfo(_Record, omit_defaults=True):
    """`traces[].distributed_info`: the trace's own `distributedInfo`, where it has one (its
    `backend`, `rank`, `world_size` and `nccl_version`, those it holds)."""

    backend: Annotated[str | None, Meta(description='`nccl`, `gloo` ...')] = None
    rank: Annotated[Whole | None, Meta(description='the rank it records')] = None
    world_size: Annotated[Whole | None, Meta(description='the world size it records')] = None
    nccl_version: Annotated[str | None, Meta(description="NCCL's version")] = None


class MemoryCapacity(_Record, omit_defaults=True):
    """`traces[].memory_capacity` (*v2*): the memory `perfscope profile` recorded in the trace's
    host record, the figures it holds (`{}` without one)."""

    host_total_bytes: Annotated[NonNeg | None, Meta(description="the host's memory")] = None
    device_total_bytes: Annotated[NonNeg | None, Meta(description="the device's memory")] = None
    device: Annotated[str | None, Meta(description="the device's name")] = None


class TraceEntry(_Record):
    """`traces[]`: one object per trace file."""

    path: Annotated[str | None, Meta(description=(
        'absolute, so that a report rendered later from another directory finds the file'))] = None
    fingerprint: Annotated[str | None, Meta(description=(
        "*v2*: 32 hex digits of the file's size and first and last 64 KiB, when it was read: `perfscope "
        'report` draws the timeline only from a trace with this fingerprint (null for an unreadable path)'))] = None
    worker: Annotated[str | None, Meta(description="the trace's worker name")] = None
    rank: Annotated[Whole | None, Meta(description='its rank')] = None
    rank_source: Annotated[str | None, Meta(description='*v2*: `distributedInfo`, `file name` or null')] = None
    world_size: Annotated[Whole | None, Meta(description='the world size it records')] = None
    mode: Annotated[str | None, Meta(description='`gpu` or `cpu`')] = None
    events: Annotated[Number | None, Meta(description='duration events kept')] = None
    has_step_markers: Annotated[bool | None, Meta(description='it holds `ProfilerStep#N` ranges')] = None
    truncated: Annotated[bool | None, Meta(description='*v2*: the file ended early')] = None
    devices: Annotated[list[str] | None, Meta(description='device names')] = None
    distributed_info: Annotated[DistributedInfo | None, Meta(description='where the trace has it')] = None
    base_time_ns: Annotated[Number | None, Meta(description=(
        "*v2*: the file's `baseTimeNanoseconds`, 0 when absent"))] = None
    host_steps_recorded: Annotated[Number | None, Meta(description=(
        '*v2*: steps with a host record (`docs/collection.md`)'))] = None
    memory_capacity: Annotated[MemoryCapacity | None, Meta(description=(
        "*v2*: the host's and device's memory, from the host record"))] = None
    energy: Annotated[dict[str, str | None] | None, Meta(description=(
        "*v2*: the host record's energy counter: `source` (NVML, RAPL), `unit` (GPU, machine), `machine`; "
        "or `why` none was read"))] = None
    warnings: Annotated[list[str] | None, Meta(description="this file's warnings")] = None
    data_quality: Annotated[list[TraceQuality] | None, Meta(description=(
        "*v2*: this file's entries, as `data_quality[]` without `traces`"))] = None


class Skipped(_Record):
    """`skipped[]` (*v2*): files of a directory that could not be read."""

    path: Annotated[str | None, Meta(description='the file')] = None
    reason: Annotated[str | None, Meta(description='why, in words')] = None
    damaged: Annotated[bool | None, Meta(description='a trace with damage, rather than a file that is no trace')] = None


# --- details ---------------------------------------------------------------------------------

class WhatIf(_Record):
    """`details.what_if[]`: per removable class with a cost, largest saving first. Earlier
    summaries held `median_step_us`/`median_step_without_us` (medians before and after, which a
    small cause inflated); the report recomputes the what-ifs from `steps`."""

    class_: Annotated[Token | None, Meta(description='the class')] = msgspec.field(default=None, name="class")
    step_time_us: Annotated[Number | None, Meta(description="the run's step time now")] = None
    step_time_without_us: Annotated[Number | None, Meta(description=(
        "the class's cost removed from every rank's step, step by step, then the run's step time taken: "
        'an upper bound of the gain'))] = None
    saved_us_per_step: Annotated[Number | None, Meta(description='the difference')] = None
    speedup: Annotated[Number | None, Meta(description='`step_time_us / step_time_without_us`')] = None


class TopRow(_Record):
    """`details.top_kernels[]` (GPU runs: the 20 kernels with the largest total time) and
    `details.top_operators[]` (CPU-only runs: the same for top-level operators on the main
    thread)."""

    name: Annotated[str | None, Meta(description='kernel or operator name')] = None
    count: Annotated[Number | None, Meta(description='calls')] = None
    total_us: Annotated[Number | None, Meta(description='total time')] = None
    mean_us: Annotated[Number | None, Meta(description='mean time')] = None
    share: Annotated[Share | None, Meta(description='of all kernel (operator) time')] = None


class LaunchStats(_Record):
    """`details.launch_stats` (GPU runs; null on CPU): delays are kernel start minus the *end* of
    its launch call, clipped at 0, as Holistic Trace Analysis defines them (version 1 took the start
    of the call)."""

    kernels: Annotated[Number | None, Meta(description='kernels launched')] = None
    graph_kernels: Annotated[Number | None, Meta(description=(
        '*v2*: replayed from CUDA graphs, no launch delay of their own'))] = None
    short_kernels: Annotated[Number | None, Meta(description='shorter than `short_kernel_us`')] = None
    short_kernel_us: Annotated[Number | None, Meta(description='10')] = None
    median_launch_delay_us: Annotated[Number | None, Meta(description='median launch delay')] = None
    p90_launch_delay_us: Annotated[Number | None, Meta(description='90th percentile launch delay')] = None
    long_delay_kernels: Annotated[Number | None, Meta(description='delay above `long_delay_us`')] = None
    long_delay_us: Annotated[Number | None, Meta(description='100')] = None


class MemcpyRow(_Record):
    """`details.memcpy[]`: per direction and host memory kind."""

    direction: Annotated[str | None, Meta(description='`HtoD`, `DtoH`, `DtoD`, `PtoP`, `other`')] = None
    pageable: Annotated[bool | None, Meta(description='from pageable host memory')] = None
    count: Annotated[Number | None, Meta(description='copies')] = None
    zero_duration: Annotated[Number | None, Meta(description=(
        '*v2*: copies of 0 µs, counted but not in the bandwidth'))] = None
    total_us: Annotated[Number | None, Meta(description='their time')] = None
    bytes: Annotated[Number | None, Meta(description='null when the trace has none')] = None
    gb_per_s: Annotated[Number | None, Meta(description='over the copies that took time and report bytes')] = None


class IdleGaps(_Record):
    """`details.idle_gaps` (GPU runs): histogram of GPU idle gaps inside the step windows."""

    edges_us: Annotated[list[Number | None] | None, Meta(description='bin edges, null for infinity')] = None
    count: Annotated[list[Number | None] | None, Meta(description='gaps per bin')] = None
    total_us: Annotated[list[Number | None] | None, Meta(description='idle time per bin')] = None


class WaitCause(_Record):
    """`details.other_waits.causes.*`: one cause of `other` idle."""

    us: Annotated[Number | None, Meta(description='its time')] = None
    calls: Annotated[Any, Meta(description='the calls that showed it')] = None


class OtherWaits(_Record):
    """`details.other_waits` (*v2*, GPU runs): what the GPU waited on in `other` idle
    (`docs/metrics.md`)."""

    other_idle_us: Annotated[Number | None, Meta(description='`other` idle of the counted steps')] = None
    causes: Annotated[dict[str, WaitCause] | None, Meta(description=(
        '`host synchronisation`, `cross-stream wait`, `not shown in the trace`'))] = None


class RankRow(_Record):
    """`details.ranks[]`: per rank, over the counted steps."""

    rank: Annotated[Whole | None, Meta(description='the rank')] = None
    median_step_time_us: Annotated[Number | None, Meta(description='median step time')] = None
    median_compute_us: Annotated[Number | None, Meta(description='median compute (operators on CPU)')] = None
    median_comm_us: Annotated[Number | None, Meta(description='median communication')] = None
    wait_for_slowest_us: Annotated[Number | None, Meta(description=(
        "estimate: median over steps of the slowest rank's compute time minus this rank's"))] = None
    median_late_us: Annotated[Number | None, Meta(description=(
        '*v2*: measured from matched collectives on one clock; null when none matched'))] = None
    median_collective_wait_us: Annotated[Number | None, Meta(description='*v2*: likewise')] = None


class Straggler(_Record):
    """`details.straggler` (*v2*): the rank the others wait for, last in more than half of the
    steps; null without matched collectives or when nobody waits."""

    rank: Annotated[Whole | None, Meta(description='the rank')] = None
    basis: Annotated[str | None, Meta(description=(
        '`arrival`: it arrives last, on one clock; `collective waits`: the clocks disagree and it waits '
        'least'))] = None
    steps_last: Annotated[Whole | None, Meta(description='steps it was last in')] = None
    steps: Annotated[Whole | None, Meta(description='steps compared')] = None
    median_late_us: Annotated[Number | None, Meta(description='null on the `collective waits` basis')] = None
    median_others_wait_us: Annotated[Number | None, Meta(description="the others' median wait")] = None


class MemoryRank(_Record):
    """`details.memory.ranks[]`: one rank's peaks."""

    rank: Annotated[Whole | None, Meta(description='the rank')] = None
    host: Annotated[str | None, Meta(description='its host')] = None
    peak_allocated_bytes: Annotated[NonNeg | None, Meta(description="device: the allocator's allocated peak")] = None
    peak_reserved_bytes: Annotated[NonNeg | None, Meta(description='device: its reserved peak')] = None
    peak_rss_bytes: Annotated[NonNeg | None, Meta(description="host: the resident set's peak")] = None
    capacity_bytes: Annotated[NonNeg | None, Meta(description="the device's or host's memory")] = None
    headroom_bytes: Annotated[Number | None, Meta(description='capacity less peak')] = None
    headroom_share: Annotated[Number | None, Meta(description='headroom over capacity')] = None


class Memory(_Record):
    """`details.memory` (*v2*): null without a per-step memory record (traces not taken by
    `perfscope profile`). Run-wide figures are the tightest rank's; on the host the ranks of one
    machine share it, their peaks summed, so headroom can be negative."""

    kind: Annotated[Token | None, Meta(description=(
        "`device`: the CUDA allocator's peaks; `host`: the resident set"))] = None
    ranks: Annotated[list[MemoryRank] | None, Meta(description='per rank')] = None
    peak_bytes: Annotated[NonNeg | None, Meta(description='run-wide peak')] = None
    capacity_bytes: Annotated[NonNeg | None, Meta(description='capacity')] = None
    headroom_bytes: Annotated[Number | None, Meta(description='headroom')] = None
    headroom_share: Annotated[Number | None, Meta(description='headroom over capacity')] = None
    near_limit: Annotated[bool | None, Meta(description='headroom below `near_limit_share`')] = None
    near_limit_share: Annotated[Number | None, Meta(description='0.10')] = None
    problems: Annotated[list[str] | None, Meta(description=(
        'records that contradict themselves, e.g. a device peak above its capacity: that rank gets no '
        'capacity'))] = None


class TraceMemoryStep(_Record):
    """`details.trace_memory[].devices[].steps[]`: one counted step."""

    step: Annotated[Whole | None, Meta(description='the step')] = None
    peak_allocated_bytes: Annotated[Number | None, Meta(description=(
        'the highest allocated level in it (a change, when `relative`)'))] = None
    growth_bytes: Annotated[Number | None, Meta(description=(
        'allocated at its end less at its start (null when the level before it is unknown)'))] = None
    allocations: Annotated[Whole | None, Meta(description='allocations in it')] = None


class TraceMemoryOperator(_Record):
    """`details.trace_memory[].devices[].top_operators[]`: an operator charged with allocations
    (the innermost one around them that does not merely provide memory, such as `aten::empty`)."""

    name: Annotated[str | None, Meta(description='the operator')] = None
    allocations: Annotated[Whole | None, Meta(description='allocations charged to it')] = None
    bytes: Annotated[NonNeg | None, Meta(description='their bytes')] = None
    share: Annotated[Share | None, Meta(description="of the device's bytes allocated in the counted steps")] = None


class TraceMemoryDevice(_Record):
    """`details.trace_memory[].devices[]`: one device's allocator, from the trace's `[memory]`
    instants in the counted steps."""

    device: Annotated[str | None, Meta(description='`cuda:0`, `cpu`...')] = None
    relative: Annotated[bool | None, Meta(description=(
        'the trace has no allocator totals (2021 format): levels are changes since its first instant'))] = None
    events: Annotated[Whole | None, Meta(description='instants in the counted steps')] = None
    since_profiler_start: Annotated[bool | None, Meta(description=(
        "`cpu`: the profiler counts the CPU allocator's bytes from its own start, so levels are what was "
        "allocated since then, never the process's memory (its resident set is `details.memory`)"))] = None
    allocations: Annotated[Whole | None, Meta(description='allocations among them')] = None
    allocated_bytes: Annotated[NonNeg | None, Meta(description='bytes those allocations took')] = None
    peak_allocated_bytes: Annotated[Number | None, Meta(description='the highest allocated level')] = None
    peak_reserved_bytes: Annotated[NonNeg | None, Meta(description=(
        "the highest reserved level (null: the trace has no reserve, as the CPU allocator's)"))] = None
    growth_bytes: Annotated[Number | None, Meta(description=(
        'allocated at the end of the last counted step less at the start of the first'))] = None
    steps: Annotated[list[TraceMemoryStep] | None, Meta(description='per counted step')] = None
    curve: Annotated[list[list[Number | None]] | None, Meta(description=(
        '`[ms since the first counted step began, allocated, reserved or null]`, the highest of each of at '
        'most 240 time buckets'))] = None
    top_operators: Annotated[list[TraceMemoryOperator] | None, Meta(description=(
        'the 10 operators charged with the most bytes (null: too many operators to sweep)'))] = None


class TraceMemoryRank(_Record):
    """`details.trace_memory[]` (*v2*): one trace with the allocator's `[memory]` instants
    (recorded with `profile_memory=True`); the section is null when no trace has any."""

    rank: Annotated[Whole | None, Meta(description="the trace's rank")] = None
    worker: Annotated[str | None, Meta(description='its worker name')] = None
    devices: Annotated[list[TraceMemoryDevice] | None, Meta(description='per device, most bytes first')] = None


class RunPhase(_Record):
    """`details.run_steps[].phases.*`: one phase of the steady steps (`input`, `forward`,
    `backward`, `optimizer`, `other`)."""

    median_s: Annotated[NonNeg | None, Meta(description='its median seconds per step')] = None
    share: Annotated[Share | None, Meta(description="of the steady steps' time")] = None


class RunWindow(_Record):
    """`details.run_steps[].window`: the profiled window beside the whole run."""

    first: Annotated[Whole | None, Meta(description="the window's first step")] = None
    last: Annotated[Whole | None, Meta(description='its last step')] = None
    steps: Annotated[Whole | None, Meta(description='its steps found in the record')] = None
    median_s: Annotated[NonNeg | None, Meta(description='its median step, seconds')] = None
    ratio: Annotated[NonNeg | None, Meta(description="its median over the run's steady median")] = None
    percentile: Annotated[Share | None, Meta(description="share of the run's steady steps faster than its median")] = None
    representative: Annotated[bool | None, Meta(description='`ratio` within 10% of 1')] = None


class RunSlowStep(_Record):
    """`details.run_steps[].slow_steps[]`: a steady step much slower than the run's pace."""

    step: Annotated[Whole | None, Meta(description='the step')] = None
    seconds: Annotated[NonNeg | None, Meta(description='its time')] = None
    ratio: Annotated[NonNeg | None, Meta(description='over the median step')] = None
    phase: Annotated[str | None, Meta(description='the phase that grew the most over its median')] = None
    extra_s: Annotated[Number | None, Meta(description='how much it grew, seconds')] = None


class RunPeriodic(_Record):
    """`details.run_steps[].periodic`: slow steps at one interval (checkpoints, evaluation, GC)."""

    every: Annotated[Whole | None, Meta(description='steps between them')] = None
    steps: Annotated[list[Whole] | None, Meta(description='the slow steps (at most 20)')] = None
    phase: Annotated[str | None, Meta(description='the phase most of them grew in')] = None


class RunCreep(_Record):
    """`details.run_steps[].memory_creep[]`: memory that kept growing over the steady steps."""

    memory: Annotated[str | None, Meta(description='`rss` (host) or `device_allocated` (CUDA)')] = None
    bytes_per_step: Annotated[Number | None, Meta(description='the Theil-Sen slope')] = None
    growth_bytes: Annotated[Number | None, Meta(description='the slope over the steps read')] = None
    from_bytes: Annotated[Number | None, Meta(description="the fitted line at the first step read")] = None
    to_bytes: Annotated[Number | None, Meta(description='and at the last')] = None
    first_step: Annotated[Whole | None, Meta(description='the first step read')] = None
    last_step: Annotated[Whole | None, Meta(description='the last')] = None


class RunSteps(_Record):
    """`details.run_steps[]` (*v2*): one rank's every step, timed outside the profiler by `perfscope
    profile` (the record `<trace>.run.jsonl` beside the trace; `docs/metrics.md`, "The whole run");
    the section is null for traces without one. The first 2 steps are start-up; the figures below
    are over the rest outside the profiler's trace (the steady steps), each step without the
    profiler's own work at its boundaries."""

    rank: Annotated[Whole | None, Meta(description="the trace's rank")] = None
    worker: Annotated[str | None, Meta(description='its worker name')] = None
    steps: Annotated[Whole | None, Meta(description='steps in the record')] = None
    first_step: Annotated[Whole | None, Meta(description='the first')] = None
    last_step: Annotated[Whole | None, Meta(description='the last')] = None
    truncated: Annotated[bool | None, Meta(description='the record stopped at 200,000 steps')] = None
    total_s: Annotated[NonNeg | None, Meta(description="every step's time, summed")] = None
    startup_s: Annotated[NonNeg | None, Meta(description='the start-up steps\' time')] = None
    traced_steps: Annotated[Whole | None, Meta(description='steps the profiler traced (warm-up and window)')] = None
    steady_steps: Annotated[Whole | None, Meta(description='the steps the figures below are over')] = None
    steady_untraced: Annotated[bool | None, Meta(description=(
        'they are all outside the trace; false when fewer than 3 were (the run ended with its window) and the '
        'traced steps stand in'))] = None
    profiler_s: Annotated[NonNeg | None, Meta(description=(
        "the profiler's own work at step boundaries (start, stop, writing the trace), left out of each step's "
        "figures"))] = None
    own_cost_us: Annotated[NonNeg | None, Meta(description=(
        "perfscope's own work at a step boundary outside the trace (the profiler's step, the timer's line), "
        "median, µs (null: fewer than 3 such steps); the hooks' few µs a call are measured in "
        "`bench/bench_run_timer.py`"))] = None
    median_s: Annotated[NonNeg | None, Meta(description='the median steady step')] = None
    mean_s: Annotated[NonNeg | None, Meta(description='the mean steady step')] = None
    p90_s: Annotated[NonNeg | None, Meta(description='the 90th percentile')] = None
    max_s: Annotated[NonNeg | None, Meta(description='the slowest steady step')] = None
    phases: Annotated[dict[str, RunPhase] | None, Meta(description='per phase')] = None
    window: Annotated[RunWindow | None, Meta(description='the profiled window beside the run')] = None
    slow_threshold_s: Annotated[NonNeg | None, Meta(description=(
        'a steady step above this is slow: 1.5x the median, 5 scaled MADs and 2 ms above it'))] = None
    slow_steps: Annotated[list[RunSlowStep] | None, Meta(description='the 20 slowest of them')] = None
    slow_count: Annotated[Whole | None, Meta(description='how many there were')] = None
    periodic: Annotated[RunPeriodic | None, Meta(description='null: not at one interval')] = None
    memory_creep: Annotated[list[RunCreep] | None, Meta(description='memory that kept growing ([]: none)')] = None
    curve: Annotated[list[list[Number | None]] | None, Meta(description=(
        '`[step, seconds, input, forward, backward, optimizer, rss bytes, device allocated bytes]` (seconds '
        "without the profiler's work): the slowest step of each of at most 480 runs of consecutive steps"))] = None
    sample_s: Annotated[list[NonNeg] | None, Meta(description=(
        'the steady steps\' seconds, every k-th so that at most 2,000 remain (what `perfscope check --all-steps` '
        'compares)'))] = None


class MfuOperator(_Record):
    """`details.mfu.top_operators[]`: an operator the FLOPs were counted in."""

    name: Annotated[str | None, Meta(description='`aten::mm`...')] = None
    flops: Annotated[NonNeg | None, Meta(description='its FLOPs a step (per rank)')] = None
    share: Annotated[Share | None, Meta(description='of the counted FLOPs')] = None


class Mfu(_Record):
    """`details.mfu` (*v2*): model FLOPs utilisation (`docs/metrics.md`, Model FLOPs utilisation);
    null when no trace has FLOPs (neither counted by `perfscope profile` nor input shapes)."""

    flops_per_step: Annotated[NonNeg | None, Meta(description='FLOPs a step, the mean over the ranks with a figure')] = None
    source: Annotated[str | None, Meta(description=(
        '`counted` (one start-up step under `FlopCounterMode`) or `shapes` (the operators\' `Input Dims`)'))] = None
    counted_step: Annotated[Whole | None, Meta(description='the step counted')] = None
    ranks: Annotated[Whole | None, Meta(description='ranks with a figure')] = None
    top_operators: Annotated[list[MfuOperator] | None, Meta(description='at most 8')] = None
    math: Annotated[str | None, Meta(description='`fp32`, `tf32`, `bf16`, `fp16` or `fp64`')] = None
    device: Annotated[str | None, Meta(description='the GPU\'s name (null on a CPU)')] = None
    step_time_s: Annotated[NonNeg | None, Meta(description="the run's step time")] = None
    achieved_tflops: Annotated[NonNeg | None, Meta(description='FLOPs a step over the step time, per rank')] = None
    peak_tflops: Annotated[NonNeg | None, Meta(description='the device\'s (or the CPU cores\') dense peak')] = None
    peak_math: Annotated[str | None, Meta(description='the math of that peak')] = None
    mfu: Annotated[NonNeg | None, Meta(description='achieved over peak')] = None
    why: Annotated[str | None, Meta(description='why `mfu` is null')] = None
    assumptions: Annotated[list[str] | None, Meta(description='what the figure rests on')] = None


class ModuleRow(_Record):
    """`details.modules.rows[]`: one `nn.Module` over the counted steps, all ranks (µs)."""

    module: Annotated[str | None, Meta(description=(
        "its path and class (`ResNet.layer1.0.conv1 (Conv2d)`), or the profiler's name (`Conv2d_0`)"))] = None
    depth: Annotated[Whole | None, Meta(description='dots in the path')] = None
    calls: Annotated[Whole | None, Meta(description='forward calls')] = None
    host_us: Annotated[NonNeg | None, Meta(description='host time in its forward')] = None
    host_self_us: Annotated[NonNeg | None, Meta(description='less its child modules\'')] = None
    device_us: Annotated[NonNeg | None, Meta(description='device time of the work launched in it')] = None
    device_self_us: Annotated[NonNeg | None, Meta(description='less its child modules\'')] = None


class Modules(_Record):
    """`details.modules` (*v2*): time per `nn.Module`, the forward pass (`docs/metrics.md`, Modules);
    null when no trace holds module ranges."""

    rows: Annotated[list[ModuleRow] | None, Meta(description=(
        'the 40 with most time, each under its parent (depth-first order of their paths)'))] = None
    modules: Annotated[Whole | None, Meta(description='distinct modules')] = None
    source: Annotated[str | None, Meta(description=(
        "`perfscope` (the ranges `perfscope profile` records) or `with_stack` (the profiler's)"))] = None


class GpuEfficiency(_Record):
    """`details.gpu_efficiency` (*v2*): how the counted steps' kernels use the GPU, from the launch
    figures Kineto writes per kernel (estimates, not hardware counters) and the kernels' names
    (`docs/metrics.md`, GPU efficiency); null without kernels."""

    kernel_us: Annotated[NonNeg | None, Meta(description="the kernels' time, summed over streams")] = None
    window_us: Annotated[NonNeg | None, Meta(description="the counted steps' time")] = None
    sm_efficiency: Annotated[Share | None, Meta(description=(
        'estimated SM efficiency: kernel time weighted by blocks per SM (at most 1) over the steps\' time; null '
        'without launch figures'))] = None
    achieved_occupancy: Annotated[Share | None, Meta(description=(
        'estimated achieved occupancy weighted by kernel time; null without launch figures'))] = None
    figured_share: Annotated[Share | None, Meta(description='kernel time with launch figures')] = None
    tensor_core_share: Annotated[Share | None, Meta(description=(
        'kernel time in kernels whose names say they run on Tensor Cores'))] = None
    tensor_core_kernels: Annotated[Whole | None, Meta(description='how many such kernels ran')] = None
    capability: Annotated[Number | None, Meta(description=(
        "the highest CUDA compute capability in the traces' `deviceProperties`"))] = None
    no_tensor_cores: Annotated[bool | None, Meta(description=(
        'a GPU with Tensor Cores (7.0 or more) whose run launched none: `details.facts.no_tensor_cores` is set'))] = None


# The figures an operator's row and each of its input shapes give (`docs/metrics.md`, Operators),
# between the row's name (or the shape's input dims) and its shapes, as the analysis writes them.
_OPERATOR_TIMES = [
    ("calls", _d(Whole | None, "calls"), None),
    ("host_us", _d(NonNeg | None, "host time, nested operators included"), None),
    ("host_self_us", _d(NonNeg | None, "host time less the operators nested in it"), None),
    ("device_us", _d(NonNeg | None, "GPU time of the kernels, copies and memsets it and the operators nested in it "
                     "launched"), None),
    ("device_self_us", _d(NonNeg | None, "GPU time of what it launched itself"), None),
]

OperatorShape = msgspec.defstruct(
    "OperatorShape", [("input_dims", _d(str | None, "the profiler's `Input Dims`, as compact JSON"), None),
                      *_OPERATOR_TIMES], bases=(_Record,), module=__name__)
OperatorShape.__doc__ = "`details.operators.rows[].shapes[]`: the calls of an operator with one input shape."

OperatorRow = msgspec.defstruct(
    "OperatorRow", [("name", _d(str | None, "the operator"), None), *_OPERATOR_TIMES,
                    ("shapes", _d(list[OperatorShape] | None, "the 3 input shapes with most time (empty without "
                                  "`record_shapes`)"), None)], bases=(_Record,), module=__name__)
OperatorRow.__doc__ = "`details.operators.rows[]`: one operator name over the counted steps, all ranks."


class Operators(_Record):
    """`details.operators` (*v2*): every CPU operator of the counted steps, on every thread, by
    name (`docs/metrics.md`, Operators); null without operators."""

    rows: Annotated[list[OperatorRow] | None, Meta(description=(
        'the 30 names with most self time: device self time on GPU runs, host self time on CPU runs'))] = None
    operators: Annotated[Whole | None, Meta(description='distinct names')] = None
    calls: Annotated[Whole | None, Meta(description='calls of all of them')] = None
    with_shapes: Annotated[bool | None, Meta(description='some operator recorded its input shapes')] = None
    skipped: Annotated[Whole | None, Meta(description=(
        'traces left out: more than 2 million operators to place'))] = None


class Telemetry(_Record):
    """`details.telemetry` (*v2*): `{"skipped": why}` without samples (no GPU, no NVML, traces
    not taken by `perfscope profile`); else NVML's samples over the counted steps
    (`docs/metrics.md`, GPU telemetry)."""

    skipped: Annotated[str | None, Meta(description='why there are no samples')] = None
    source: Annotated[str | None, Meta(description='`NVML`')] = None
    interval_s: Annotated[NonNeg | None, Meta(description='sampling interval')] = None
    averaging_s: Annotated[NonNeg | None, Meta(description='how far back a reading reaches')] = None
    samples: Annotated[Number | None, Meta(description='samples in the counted steps')] = None
    settled_samples: Annotated[Number | None, Meta(description=(
        'those taken a full `averaging_s` after the window opened'))] = None
    gpu_util_pct: Annotated[Number | None, Meta(description=(
        'mean of the settled samples (null where none is; `unsettled` says why)'))] = None
    mem_util_pct: Annotated[Number | None, Meta(description='likewise')] = None
    unsettled: Annotated[str | None, Meta(description='why no sample settled')] = None
    power_w: Annotated[dict[str, Number | None] | None, Meta(description='`mean`, `max`, settled')] = None
    sm_clock_mhz: Annotated[dict[str, Number | None] | None, Meta(description='`min`, `median`, `max`')] = None
    throttle: Annotated[dict[str, Number] | None, Meta(description='reason: share of samples')] = None
    throttled_share: Annotated[Share | None, Meta(description='samples with a throttle reason')] = None
    sampler_cpu_share: Annotated[Number | None, Meta(description="the sampler's CPU use")] = None
    alignment: Annotated[list[dict[str, Any]] | None, Meta(description=(
        "`rank`, `offset_us` from the sample clock to the trace's, `source` `step starts` or `clocks`"))] = None
    devices: Annotated[list[dict[str, Any]] | None, Meta(description='`index`, `name`, `uuid`, `rank`')] = None


class NodeRow(_Record):
    """`details.nodes.nodes[]`: one node."""

    node: Annotated[Whole | None, Meta(description='node index')] = None
    host: Annotated[str | None, Meta(description='its host name')] = None
    ranks: Annotated[list[Whole | None] | None, Meta(description='its ranks')] = None
    median_step_time_us: Annotated[Number | None, Meta(description='median step time')] = None
    median_comm_us: Annotated[Number | None, Meta(description='median communication')] = None
    median_late_us: Annotated[Number | None, Meta(description='of its latest rank')] = None
    median_collective_wait_us: Annotated[Number | None, Meta(description='median wait in collectives')] = None
    clock_offset_us: Annotated[Number | None, Meta(description=(
        'against node 0, taken out of arrivals when the collectives prove it (`docs/multinode.md`)'))] = None


class StragglerNode(_Record):
    """`details.nodes.straggler_node`: the node holding the straggler when its ranks wait least."""

    node: Annotated[Whole | None, Meta(description='the node')] = None
    rank: Annotated[Whole | None, Meta(description='the straggler rank')] = None
    basis: Annotated[str | None, Meta(description='as `details.straggler.basis`')] = None


class ProcessGroup(_Record):
    """`details.nodes.process_groups.groups[]`: from `distributedInfo.pg_config`."""

    name: Annotated[str | None, Meta(description='group name')] = None
    desc: Annotated[str | None, Meta(description='its description')] = None
    size: Annotated[Whole | None, Meta(description='ranks in it')] = None
    span: Annotated[str | None, Meta(description='`intra-node`, `inter-node` or `unknown`')] = None


class ProcessGroups(_Record):
    """`details.nodes.process_groups`."""

    groups: Annotated[list[ProcessGroup] | None, Meta(description='the groups')] = None
    intra_node: Annotated[Whole | None, Meta(description='groups within one node')] = None
    inter_node: Annotated[Whole | None, Meta(description='groups across nodes')] = None


class Link(_Record):
    """`details.nodes.link`: from the first DDP record; null without one."""

    gradient_bytes: Annotated[Number | None, Meta(description='bytes of gradients per step')] = None
    buckets: Annotated[Whole | None, Meta(description='DDP buckets')] = None
    comm_hook: Annotated[str | None, Meta(description='DDP communication hook')] = None
    algorithm: Annotated[str | None, Meta(description='`flat ring` or `hierarchical`')] = None
    inter_node_bytes_per_step: Annotated[Number | None, Meta(description="through each node's link")] = None
    achieved_bits_per_s: Annotated[dict[str, Number] | None, Meta(description=(
        "per node (as text): those bytes over the node's median communication time, a lower bound of the "
        "link's rate"))] = None
    slowest_link_node: Annotated[Whole | None, Meta(description='the node of the lowest rate')] = None


class Nodes(_Record):
    """`details.nodes` (*v2*): a job over several nodes (null for one node, or when the traces do
    not tell nodes apart)."""

    source: Annotated[str | None, Meta(description=(
        "`perfscope`: the node ranks `perfscope profile` recorded in each trace's `perfscope_job` header;"
        ' `host name`: distinct `host_name`s'))] = None
    count: Annotated[Whole | None, Meta(description='nodes')] = None
    nodes: Annotated[list[NodeRow] | None, Meta(description='per node')] = None
    straggler_node: Annotated[StragglerNode | None, Meta(description='null otherwise')] = None
    problems: Annotated[list[str] | None, Meta(description='what could not be told apart')] = None
    process_groups: Annotated[ProcessGroups | None, Meta(description="the job's process groups")] = None
    link: Annotated[Link | None, Meta(description='the inter-node link')] = None


class OptimizerStep(_Record):
    """`details.facts.optimizer_step`: the optimizer's `Optimizer.step#` ranges over the verdict's
    steps (`perfscope.analysis.optimizer_step`)."""

    classes: Annotated[list[str] | None, Meta(description='optimizer classes of the outermost ranges')] = None
    implementation: Annotated[str | None, Meta(description=(
        '`fused`, `foreach`, `for-loop` (from the operators inside the ranges), or `mixed`'))] = None
    closure: Annotated[bool | None, Meta(description=(
        "a closure's forward and backward ran inside the ranges (`optimizer.step(closure)`: LBFGS, Lightning); "
        "they are left out of the optimizer's time and operators"))] = None
    operators_per_step: Annotated[NonNeg | None, Meta(description=(
        "the optimizer's own operators a step (median)"))] = None
    optimizer_us_per_step: Annotated[NonNeg | None, Meta(description=(
        "µs of the optimizer's own update a step (median): the ranges after a closure's backward"))] = None
    share: Annotated[Share | None, Meta(description="the ranges' time over the steps' time")] = None
    step_time_us: Annotated[NonNeg | None, Meta(description="the run's step time now")] = None
    step_time_without_us: Annotated[NonNeg | None, Meta(description=(
        "the run's step time without the ranges: the bound of a faster optimizer step"))] = None
    speedup: Annotated[Number | None, Meta(description='step time now over without')] = None


class JobLayout(_Record):
    """`details.facts.job` (*v2*): the job's layout, from the first rank's job record."""

    nnodes: Annotated[Whole | None, Meta(description='nodes of the job')] = None
    local_world_size: Annotated[Whole | None, Meta(description='ranks a node')] = None


class Facts(_Record):
    """`details.facts`: run facts the verdicts and the tools read, each null when not recorded."""

    cuda_graphs: Annotated[bool | None, Meta(description='kernels replayed from CUDA graphs')] = None
    ddp: Annotated[DdpRecord | None, Meta(description="*v2*: the first rank's DDP record, below")] = None
    loader: Annotated[LoaderRecord | None, Meta(description=(
        '*v2*: the first DataLoader the script iterated, below'))] = None
    job: Annotated[JobLayout | None, Meta(description="*v2*: the job's layout, below")] = None
    no_tensor_cores: Annotated[Number | None, Meta(description=(
        '*v2*: the compute capability (7.0 or more) of a GPU whose kernels include none that runs on Tensor '
        'Cores; null otherwise'))] = None
    convolutions: Annotated[bool | None, Meta(description=(
        '*v2*: a convolution (operator or kernel) ran: the compute advice names channels_last only then'))] = None
    fsdp: Annotated[int | None, Meta(description=(
        '*v2*: `2` where the trace holds FSDP2\'s ranges (`FSDP::...`, fully_shard), `1` for FSDP1\'s '
        '(`FullyShardedDataParallel.`...): the comm advice names FSDP\'s knobs'))] = None
    p2p_comm_share: Annotated[Share | None, Meta(description=(
        '*v2*: the share of communication time in send/recv and all-to-all operations; null without any'))] = None
    window_attention: Annotated[Any, Meta(description='a window-attention model (Swin) was seen')] = None
    optimizer_step: Annotated[OptimizerStep | None, Meta(description=(
        "*v2*: the optimizer's step, where the trace marks it"))] = None
    graphs: Annotated[dict[str, Number] | None, Meta(description=(
        "*v2*: GPU steps: the launch cost CUDA graphs could remove at best: `share`, `step_time_us`, "
        "`step_time_without_us`, `speedup`"))] = None
    layout_transposes: Annotated[dict[str, Number] | None, Meta(description=(
        "*v2*: cuDNN's NCHW/NHWC transpose kernels in the verdict's steps: `kernels_per_step`, "
        "`transpose_us_per_step`, `share`, `step_time_us`, `step_time_without_us`, `speedup`; null without any"))] = None


class Cost(_Record):
    """`details.cost` (*v2*, with `--price-per-hour`): what a step costs in USD, over the verdict's
    step time (`docs/metrics.md`, "Cost"); each figure null with its `*_why` where unknown."""

    price_per_hour: Annotated[float, Meta(ge=0, description='`--price-per-hour`: USD an hour per device')]
    unit: Annotated[str, Meta(description='`GPU` (GPU runs: one per rank) or `machine` (CPU runs: one per node)')]
    devices: Annotated[Whole, Meta(description='the devices priced')]
    per_step: Annotated[NonNeg | None, Meta(description='`step_time_us` / 3.6e9 x price x devices')] = None
    per_step_why: Annotated[str | None, Meta(description='why `per_step` is null')] = None
    per_1000_samples: Annotated[NonNeg | None, Meta(description=(
        'per step x 1000 / (batch size x world size)'))] = None
    per_1000_samples_why: Annotated[str | None, Meta(description='why `per_1000_samples` is null')] = None
    per_run: Annotated[NonNeg | None, Meta(description=(
        "the run's time (its whole-run record, the slowest rank) x price x devices"))] = None
    per_run_why: Annotated[str | None, Meta(description='why `per_run` is null')] = None
    shares: Annotated[dict[str, NonNeg] | None, Meta(description=(
        'what each removable share (io, comm, launch) and GPU idle (other) costs a step'))] = None


class Energy(_Record):
    """`details.energy` (*v2*): the energy per step, from the host record's counter (`docs/metrics.md`,
    "Energy"); null figures come with `why`."""

    per_step_j: Annotated[NonNeg | None, Meta(description=(
        "joules a step, the job's: the mean over the verdict's steps (every step where none has a reading), "
        "summed over GPUs (NVML) or machines (RAPL)"))] = None
    per_1000_samples_j: Annotated[NonNeg | None, Meta(description='per step x 1000 / (batch size x world size)')] = None
    source: Annotated[str | None, Meta(description='`NVML` or `RAPL`')] = None
    unit: Annotated[str | None, Meta(description='`GPU` or `machine`: what one counter covers')] = None
    counters: Annotated[Whole | None, Meta(description='the counters summed (GPUs, or machines)')] = None
    why: Annotated[str | None, Meta(description='why `per_step_j` (or `per_1000_samples_j`) is null')] = None


class HostCpu(_Record):
    """`details.host_cpu` (*v2*): who held the cores where steps waited for them (over the
    `host-contended` steps, else the counted ones; null without the host record's CPU split);
    shares of the cores' time (`docs/metrics.md`, "Provisional verdict")."""

    cores: Annotated[Whole | None, Meta(description='cores of the machine')] = None
    training_process: Annotated[Share | None, Meta(description='every thread of it')] = None
    workers: Annotated[Share | None, Meta(description='its child processes: DataLoader workers')] = None
    others: Annotated[Share | None, Meta(description="the rest of the machine's busy time")] = None
    cause: Annotated[str | None, Meta(description=(
        '`this job` when its own processes used at least as much as the others and half of the cores, '
        'else `other processes`'))] = None


Advice = msgspec.defstruct(
    "Advice", [(c.name, _d(str | None, f"advice for {c.name}-bound steps"), None) for c in TABLE],
    bases=(_Record,), module=__name__)
Advice.__doc__ = ("`details.advice` (*v2*): the advice line per class, fitted to the trace (a run replaying CUDA "
                  "graphs is not told to use them).")


class Details(_Record):
    """`details`: run-level detail, over the counted steps (those the verdict uses), all ranks;
    for a provisional verdict, over the steps it classifies."""

    what_if: Annotated[list[WhatIf] | None, Meta(description='the what-ifs, below')] = None
    top_kernels: Annotated[list[TopRow] | None, Meta(description=(
        'GPU runs: the 20 kernels with the largest total time'))] = None
    top_operators: Annotated[list[TopRow] | None, Meta(description=(
        'CPU-only runs: the same for top-level operators'))] = None
    launch_stats: Annotated[LaunchStats | None, Meta(description='GPU runs: launches and their delays')] = None
    memcpy: Annotated[list[MemcpyRow] | None, Meta(description='copies by direction and host memory kind')] = None
    idle_gaps: Annotated[IdleGaps | None, Meta(description='GPU runs: idle gaps by length')] = None
    other_waits: Annotated[OtherWaits | None, Meta(description='GPU runs: what `other` idle waited on')] = None
    ranks: Annotated[list[RankRow] | None, Meta(description='per rank')] = None
    straggler: Annotated[Straggler | None, Meta(description='the rank the others wait for')] = None
    nodes: Annotated[Nodes | None, Meta(description='a job over several nodes')] = None
    memory: Annotated[Memory | None, Meta(description='peak memory and headroom')] = None
    trace_memory: Annotated[list[TraceMemoryRank] | None, Meta(description=(
        "*v2*: the allocator's instants in the traces, per trace and device"))] = None
    run_steps: Annotated[list[RunSteps] | None, Meta(description=(
        '*v2*: every step of the run, timed outside the profiler, per rank'))] = None
    gpu_efficiency: Annotated[GpuEfficiency | None, Meta(description=(
        "*v2*: GPU runs: the kernels' SM efficiency, occupancy and Tensor Core share"))] = None
    mfu: Annotated[Mfu | None, Meta(description='*v2*: model FLOPs utilisation')] = None
    operators: Annotated[Operators | None, Meta(description=(
        '*v2*: the operators by name and input shape: calls, host and device time'))] = None
    modules: Annotated[Modules | None, Meta(description='*v2*: time per nn.Module (forward)')] = None
    telemetry: Annotated[Telemetry | None, Meta(description='GPU samples (NVML)')] = None
    collectives_matched: Annotated[Number | None, Meta(description=(
        '*v2*: collectives matched across all ranks (null for one rank)'))] = None
    collectives_unmatched: Annotated[Number | None, Meta(description='*v2*: those some rank lacks')] = None
    collectives_unmatched_reason: Annotated[str | None, Meta(description=(
        '*v2*: why collectives could not be matched (null when they were, or for one rank)'))] = None
    clocks_agree: Annotated[bool | None, Meta(description=(
        "*v2*: whether the ranks' clocks pass the check of `docs/metrics.md`"))] = None
    last_counts: Annotated[dict[str, Number] | None, Meta(description=(
        '*v2*: how many steps each rank (as text) was the last to arrive'))] = None
    slowest_rank: Annotated[Whole | None, Meta(description=(
        'the rank with the largest median compute time; null for one rank'))] = None
    advice: Annotated[Advice | None, Meta(description='the advice per class')] = None
    knobs: Annotated[dict[str, list[str]] | None, Meta(description=(
        '*v2*: per class, the configuration keys its advice names (`perfscope profile --config`, `perfscope tune`), '
        'in its order; empty where the advice names none'))] = None
    facts: Annotated[Facts | None, Meta(description='run facts')] = None
    scope: Annotated[str | None, Meta(description=(
        "*v2*: the steps the tables below are over: `counted` (the verdict's), `provisional` (the host-contended "
        "steps a provisional verdict classified), `withheld` (no step has a verdict: every step with a length, "
        "each left out of the verdict for the reason its row gives)"))] = None
    host_cpu: Annotated[HostCpu | None, Meta(description='who held the cores')] = None
    cost: Annotated[Cost | None, Meta(description='*v2*: the cost per step, below (with `--price-per-hour`)')] = None
    energy: Annotated[Energy | None, Meta(description='*v2*: the energy per step, below')] = None


# --- steps -----------------------------------------------------------------------------------

_STEP_FIELDS: list[tuple[str, Any, str]] = [
    # identity
    ("rank", Whole | None, "the rank"),
    ("worker", str | None, "the trace's worker"),
    ("step", Whole | None, "the step number (`ProfilerStep#N`)"),
    ("complete", bool | None, "the step's window is whole"),
    ("mode", Token | None, "`gpu` or `cpu`"),
    # evidence
    ("status", str | None, "*v2*: `ok`, `incomplete`, `initialisation`, `host-contended`"),
    ("status_reason", str | None, "*v2*: why the step is not `ok` (null for `ok`)"),
    ("counted", bool | None, "*v2*: the verdict counts it"),
    ("verdict", Token | None, "the step's class"),
    ("runner_up", Token | None, "the next class (*v2*: null for a step not counted)"),
    ("provisional_verdict", Token | None, "*v2*, in a run with a provisional verdict: the step's class with its "
     "waits for a core taken out (its `verdict` stays null: it is not counted)"),
    ("core_wait_us", Number | None, "*v2*: the training thread's wait for a core in the step (`docs/metrics.md`)"),
    ("spin_bound_us", Number | None, "*v2*: the most the training thread may have spun for intra-op workers that "
     "waited for cores (0: none waited a quarter of the step; `docs/metrics.md`, \"Intra-op workers that wait\")"),
    ("step_time_us", NonNeg | None, "the step's time"),
    ("cpu_span_us", Number | None, "its host span"),
    ("dataloader_us", Number | None, "DataLoader fetches"),
    ("comm_us", Number | None, "communication, hidden or not"),
    ("exposed_comm_us", Number | None, "communication nothing else overlaps"),
    # GPU
    ("gpu_extended_span_us", Number | None, "GPU: the span of its GPU work"),
    ("gpu_busy_us", Number | None, "GPU: busy time"),
    ("compute_us", Number | None, "GPU: compute kernels"),
    ("h2d_us", Number | None, "GPU: host-to-device copies"),
    ("exposed_h2d_us", Number | None, "GPU: of those, not overlapped"),
    ("exposed_other_mem_us", Number | None, "GPU: other copies and memsets not overlapped"),
    ("gpu_idle_us", Number | None, "GPU: idle time"),
    ("input_wait_us", Number | None, "GPU: idle waiting on input"),
    ("launch_wait_us", Number | None, "GPU: idle waiting on launches"),
    ("h2d_wait_us", Number | None, "GPU: idle waiting on a host-to-device copy's launch"),
    ("kernel_wait_us", Number | None, "GPU: idle waiting on a kernel queued behind others"),
    ("other_idle_us", Number | None, "GPU: idle for other reasons"),
    ("unlinked_idle_us", Number | None, "GPU, *v2*: idle with no launch record to explain it"),
    ("kernel_count", Number | None, "GPU: kernels"),
    ("comm_kernel_count", Number | None, "GPU: communication kernels"),
    ("median_kernel_us", Number | None, "GPU: median kernel time"),
    ("memcpy_count", Number | None, "GPU: copies"),
    ("pageable_memcpy_count", Number | None, "GPU: copies from pageable memory"),
    # CPU-only
    ("operator_us", Number | None, "CPU: top-level operators"),
    ("framework_overhead_us", Number | None, "CPU: the main thread outside operators"),
    ("operator_count", Number | None, "CPU: top-level operators"),
    ("median_operator_us", Number | None, "CPU: median operator time"),
    # host record (docs/collection.md)
    ("host_wall_us", Number | None, "host record, *v2*: the step's wall time"),
    ("host_thread_cpu_us", Number | None, "host record: the training thread's CPU time"),
    ("host_process_cpu_us", Number | None, "host record: the process's CPU time"),
    ("host_run_queue_us", Number | None, "host record: the training thread's wait in the run queue (null where "
     "the kernel does not report it)"),
    ("host_workers_cpu_us", Number | None, "host record: its child processes' CPU time"),
    ("host_machine_busy_us", Number | None, "host record: the machine's busy CPU time"),
    ("host_cores", Number | None, "host record: the machine's cores"),
    ("host_energy_j", NonNeg | None, "host record, *v2*: the energy counter's rise over the step, joules"),
    # memory peaks
    ("peak_rss_bytes", NonNeg | None, "the process's peak resident set"),
    ("device_peak_allocated_bytes", NonNeg | None, "the CUDA caching allocator's allocated peak"),
    ("device_peak_reserved_bytes", NonNeg | None, "its reserved peak"),
    # telemetry
    ("gpu_util_pct", Number | None, "NVML: utilisation"),
    ("power_w", Number | None, "NVML: power"),
    ("sm_clock_mhz", Number | None, "NVML: SM clock"),
    ("throttled_share", Share | None, "NVML: samples throttled"),
    ("telemetry_samples", Number | None, "NVML: samples in the step"),
]


def _step_fields():
    fields = [(name, _d(kind, text), None) for name, kind, text in _STEP_FIELDS]
    for c in (*TABLE, OTHER):  # each class's cost, from the one table of classes
        fields.append((f"{c.name}_cost_frac", _d(Share | None, f"the {c.name} class's cost as a fraction of the step "
                                                 "(perfscope.classes)"), None))
    fields += [("waitfree_step_time_us", _d(NonNeg | None, "in a run with a provisional verdict, on its steps: the "
                                            "step's time without its waits for a core (`docs/metrics.md`, One clock)"),
                None),
               ("waitfree_work_keep", _d(Share | None, "the share of its work columns that time kept"), None)]
    for c in (*TABLE, OTHER):
        fields.append((f"waitfree_{c.name}_cost_frac", _d(Share | None, f"the {c.name} class's cost as a fraction "
                                                          "of `waitfree_step_time_us`"), None))
    for name, _, _ in _STEP_FIELDS:  # each time also as a fraction of the step (spans and medians excepted)
        if name.endswith("_us") and not name.startswith(("median_", "step_time", "cpu_span", "gpu_extended_span",
                                                          "core_wait", "host_")):
            fields.append((name[:-3] + "_frac", _d(Number | None, f"`{name}` over `step_time_us`"), None))
    return fields


Step = msgspec.defstruct("Step", _step_fields(), bases=(_Record,), module=__name__)
Step.__doc__ = ("`steps[]`: one object per rank and step. Metrics of the step's mode; a metric that does not apply "
                "to it (in a run mixing modes) is null, and a column no step of a trace has is absent.")


class Summary(_Record):
    """The record (`summary.json`)."""

    schema: Annotated[str, Meta(description='always `"perfscope.summary"`')] = SCHEMA
    schema_version: Annotated[int, Meta(description='`2` (version 1: before the fields marked *v2*)')] = SCHEMA_VERSION
    perfscope_version: Annotated[str | None, Meta(description='version that wrote the file')] = None
    generated_at: Annotated[str | None, Meta(description='ISO 8601 UTC time of writing')] = None
    mode: Annotated[Token | None, Meta(description=(
        '`"gpu"` if any rank\'s trace holds GPU events, else `"cpu"`'))] = None
    run: Annotated[Run | None, Meta(description='run metadata, below')] = None
    units: Annotated[dict[str, str] | None, Meta(description='the unit conventions, spelled out')] = None
    overall: Annotated[Overall | None, Meta(description="the run's verdict, below")] = None
    details: Annotated[Details | None, Meta(description='run-level detail for the report, below')] = None
    data_quality: Annotated[list[QualityEntry] | None, Meta(description=(
        '*v2*: every repair and count of the traces summed by kind, below'))] = None
    traces: Annotated[list[TraceEntry] | None, Meta(description='one object per trace file, below')] = None
    skipped: Annotated[list[Skipped] | None, Meta(description=(
        '*v2*: files of a directory that could not be read'))] = None
    notes: Annotated[list[str] | None, Meta(description=(
        'how the traces were read (no step markers, steps not counted and why)'))] = None
    warnings: Annotated[list[str] | None, Meta(description=(
        'problems that did not stop the analysis (repairs, dropped events, truncated or skipped files); '
        'also printed on stderr and at the top of the report'))] = None
    steps: Annotated[list[Step] | None, Meta(description='one object per rank and step, below')] = None


# The objects of the record in the order the docs list them: (path, struct).
SECTIONS = (
    ("", Summary), ("run", Run), ("run.schedule", Schedule), ("run.window_extension", WindowExtension),
    ("run.oom", Oom), ("run.oom.largest[]", OomBlock), ("run.config_applied", ConfigApplied),
    ("overall", Overall), ("overall.fractions", Fractions), ("overall.step_share", StepShare),
    ("details", Details), ("details.advice", Advice), ("details.what_if[]", WhatIf),
    ("details.top_kernels[]", TopRow), ("details.launch_stats", LaunchStats), ("details.memcpy[]", MemcpyRow),
    ("details.idle_gaps", IdleGaps), ("details.other_waits", OtherWaits),
    ("details.other_waits.causes.*", WaitCause), ("details.ranks[]", RankRow), ("details.straggler", Straggler),
    ("details.memory", Memory), ("details.memory.ranks[]", MemoryRank),
    ("details.trace_memory[]", TraceMemoryRank), ("details.trace_memory[].devices[]", TraceMemoryDevice),
    ("details.trace_memory[].devices[].steps[]", TraceMemoryStep),
    ("details.trace_memory[].devices[].top_operators[]", TraceMemoryOperator),
    ("details.run_steps[]", RunSteps), ("details.run_steps[].phases.*", RunPhase),
    ("details.run_steps[].window", RunWindow), ("details.run_steps[].slow_steps[]", RunSlowStep),
    ("details.run_steps[].periodic", RunPeriodic), ("details.run_steps[].memory_creep[]", RunCreep),
    ("details.gpu_efficiency", GpuEfficiency), ("details.mfu", Mfu), ("details.mfu.top_operators[]", MfuOperator),
    ("details.operators", Operators), ("details.modules", Modules), ("details.modules.rows[]", ModuleRow),
    ("details.operators.rows[]", OperatorRow), ("details.operators.rows[].shapes[]", OperatorShape),
    ("details.telemetry", Telemetry),
    ("details.nodes", Nodes), ("details.nodes.nodes[]", NodeRow), ("details.nodes.straggler_node", StragglerNode),
    ("details.nodes.process_groups", ProcessGroups), ("details.nodes.process_groups.groups[]", ProcessGroup),
    ("details.nodes.link", Link), ("details.facts", Facts), ("details.facts.ddp", DdpRecord),
    ("details.facts.loader", LoaderRecord), ("details.facts.job", JobLayout), ("details.facts.optimizer_step", OptimizerStep),
    ("details.host_cpu", HostCpu), ("details.cost", Cost), ("details.energy", Energy),
    ("data_quality[]", QualityEntry), ("traces[]", TraceEntry), ("traces[].data_quality[]", TraceQuality),
    ("traces[].distributed_info", DistributedInfo), ("traces[].memory_capacity", MemoryCapacity),
    ("skipped[]", Skipped), ("steps[]", Step),
)
assert MODES == ("gpu", "cpu")  # the step columns above are listed for these two modes
