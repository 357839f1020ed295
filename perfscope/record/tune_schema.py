"""The tuning record's schema: one msgspec struct per object of ``tune.json`` (schema
``perfscope.tune``, version 1), written by ``perfscope tune`` (:mod:`perfscope.tuner.record`).

These structs are the record's one definition: ``docs/tune-record.md`` is generated from them
(:mod:`perfscope.record.docs`), and what the tuner writes is checked against them in the tests
(:func:`perfscope.testing.record.check_tune_record`: every type as declared, no field unnamed).

Units: ``*_us`` microseconds, ``*_s`` seconds, throughputs (``value``, ``baseline[]``,
``candidate[]``) in the objective's ``unit``; speed-ups are ratios (``1.42``: 1.42x faster).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

SCHEMA = "perfscope.tune"
SCHEMA_VERSION = 1

Number = float


class _Part(msgspec.Struct, kw_only=True, omit_defaults=False):
    """Base of every object of the record: fields are keyword-only and may be absent, so each
    has a default."""


class Study(_Part):
    """`study`: the Optuna study the trials belong to."""

    name: Annotated[str | None, Meta(description='the study name (`--study-name`)')] = None
    storage: Annotated[str | None, Meta(description='where it is stored, any password removed')] = None
    trials_target: Annotated[int | None, Meta(description='`--trials`: finished trials wanted, study-wide')] = None
    direction: Annotated[str | None, Meta(description='always `maximize` (throughput)')] = None


class Objective(_Part):
    """`objective`: what a trial's value measures."""

    name: Annotated[str | None, Meta(description=(
        '`--objective`: `time` (throughput) or `cost` (USD per 1,000 samples: the same ordering, `cost` below)'))] = None
    unit: Annotated[str | None, Meta(description='`samples/s` or `steps/s`')] = None
    warmup_steps: Annotated[int | None, Meta(description='steps run first and not counted')] = None
    measure_steps: Annotated[int | None, Meta(description='the fewest measured steps')] = None
    target_rse: Annotated[Number | None, Meta(description=(
        'relative standard error to measure down to (null: a fixed window)'))] = None
    measure_cap_s: Annotated[Number | None, Meta(description=(
        'seconds of measured steps after which the window ends'))] = None
    statistic: Annotated[str | None, Meta(description='`window`: measured samples over measured seconds')] = None


class Window(_Part):
    """`trials[].window`, `baseline.window`: the measured window of a run."""

    target_rse: Annotated[Number | None, Meta(description='as `objective.target_rse`')] = None
    cap_s: Annotated[Number | None, Meta(description='as `objective.measure_cap_s`')] = None
    rse: Annotated[Number | None, Meta(description="the relative standard error of the window's throughput")] = None
    steps: Annotated[int | None, Meta(description='measured steps')] = None
    seconds: Annotated[Number | None, Meta(description='their time')] = None
    extra_steps: Annotated[int | None, Meta(description=(
        'steps measured beyond the fewest, for the error target'))] = None
    round_steps: Annotated[int | None, Meta(description='steps per round of DataLoader workers')] = None
    ended_by: Annotated[str | None, Meta(description='`error target`, `time cap` or `script ended`')] = None


class Threads(_Part):
    """`trials[].threads`, `baseline.threads`: what competed for the cores during the run."""

    intra_op_threads: Annotated[int | None, Meta(description="the training process's intra-op threads")] = None
    loader_workers: Annotated[int | None, Meta(description='DataLoader worker processes')] = None
    cores: Annotated[int | None, Meta(description="the machine's cores")] = None
    demand: Annotated[int | None, Meta(description='threads and workers wanting a core')] = None
    load_1m: Annotated[Number | None, Meta(description="the host's one-minute load when the first step began")] = None


class Baseline(_Part):
    """`baseline`: the user's own configuration, measured and profiled first."""

    trial: Annotated[int | None, Meta(description='its trial number')] = None
    value: Annotated[Number | None, Meta(description='its throughput')] = None
    verdict: Annotated[str | None, Meta(description='the verdict of its profiled steps')] = None
    window: Annotated[Window | None, Meta(description='its measured window')] = None
    threads: Annotated[Threads | None, Meta(description='what competed for the cores')] = None
    fractions: Annotated[dict[str, Number | None] | None, Meta(description=(
        "each class's share of its step time"))] = None
    step_time_us: Annotated[Number | None, Meta(description="the profiled steps' window over steps")] = None
    summary: Annotated[str | None, Meta(description='its `summary.json`, relative to the output folder')] = None
    report: Annotated[str | None, Meta(description='its `report.html`, likewise')] = None


class SearchedKnob(_Part):
    """`space.searched[]`: a knob the study searches."""

    name: Annotated[str | None, Meta(description='the knob')] = None
    group: Annotated[str | None, Meta(description='its knob group')] = None
    serves: Annotated[list[str] | None, Meta(description='the bottlenecks it addresses')] = None
    choices: Annotated[str | list[Any] | None, Meta(description=(
        'its values, as text (a list of the values in a hand-written record is read too)'))] = None
    baseline: Annotated[Any, Meta(description="the script's own value (null: unset)")] = None


class Space(_Part):
    """`space`: what the study searches, in the order of the baseline's bottlenecks."""

    verdict: Annotated[str | None, Meta(description="the baseline's verdict")] = None
    order: Annotated[list[str] | None, Meta(description='bottlenecks, the largest first')] = None
    searched: Annotated[list[SearchedKnob] | None, Meta(description='the knobs searched')] = None
    excluded: Annotated[dict[str, str] | None, Meta(description='knob: why it is not searched')] = None
    groups: Annotated[dict[str, str] | None, Meta(description='group: what its knobs are')] = None
    min_share: Annotated[Number | None, Meta(description=(
        'the smallest share of step time a bottleneck is searched for'))] = None


class Failure(_Part):
    """`trials[].failure`: why a trial's run failed."""

    kind: Annotated[str | None, Meta(description=(
        '`oom`, `crash`, `killed`, `timeout`, `output`, `unsafe`, `too-few-steps`, `unmeasured`, '
        '`interrupted` or `lost`'))] = None
    reason: Annotated[str | None, Meta(description='in words')] = None


class Numerics(_Part):
    """`trials[].numerics`: the numerics guard's finding (docs/tune.md, Numerics guard)."""

    status: Annotated[str | None, Meta(description=(
        '`ok`, `unsafe` or `not-visible` (pruned and failed trials: not measured)'))] = None
    detail: Annotated[str | None, Meta(description='what it saw')] = None


class TrialMemory(_Part):
    """`trials[].memory`: its profiled steps' peak memory (`docs/metrics.md`, Memory)."""

    kind: Annotated[str | None, Meta(description='`device` or `host`')] = None
    peak_bytes: Annotated[Number | None, Meta(description='the peak')] = None
    capacity_bytes: Annotated[Number | None, Meta(description="the device's or machine's memory")] = None
    headroom_share: Annotated[Number | None, Meta(description='headroom over capacity')] = None
    near_limit: Annotated[bool | None, Meta(description='headroom below 10%')] = None


class Trial(_Part):
    """`trials[]`: one trial of the study, in trial-number order."""

    number: Annotated[int | None, Meta(description='the trial number')] = None
    state: Annotated[str | None, Meta(description='`complete`, `pruned`, `failed`, `running` or `waiting`')] = None
    role: Annotated[str | None, Meta(description='`baseline`, `guess` or `search`')] = None
    params: Annotated[dict[str, Any] | None, Meta(description="the sampler's parameters")] = None
    config: Annotated[dict[str, Any] | None, Meta(description='the configuration: the knobs it changes')] = None
    value: Annotated[Number | None, Meta(description=(
        'its throughput (null for a run that failed; an unsafe one keeps its value; a pruned one: its last '
        'reported throughput)'))] = None
    step_values: Annotated[list[Number] | None, Meta(description='its throughput reported step by step')] = None
    feasible: Annotated[bool | None, Meta(description='complete, measured and safe')] = None
    failure: Annotated[Failure | None, Meta(description='null unless its run failed')] = None
    numerics: Annotated[Numerics | None, Meta(description="the numerics guard's finding")] = None
    verdict: Annotated[str | None, Meta(description='the verdict of its profiled steps')] = None
    memory: Annotated[TrialMemory | None, Meta(description="its profiled steps' peak memory")] = None
    duration_s: Annotated[Number | None, Meta(description='its wall time')] = None
    window: Annotated[Window | None, Meta(description='its measured window')] = None
    threads: Annotated[Threads | None, Meta(description='what competed for the cores')] = None


class Startup(_Part):
    """`recommendation.startup`, `confirmation.candidates[].startup`: a candidate's start-up cost
    (compile time) against its gain (docs/tune.md, step 6)."""

    extra_s: Annotated[Number | None, Meta(description="start-up seconds beyond the baseline's")] = None
    step_s: Annotated[Number | None, Meta(description="the baseline's median step")] = None
    speedup: Annotated[Number | None, Meta(description='the steady per-step speed-up')] = None
    break_even_steps: Annotated[Number | None, Meta(description=(
        'steps after which it has caught up (null: never)'))] = None
    run_steps: Annotated[int | None, Meta(description='`--run-steps` (null: not given)')] = None
    net_speedup: Annotated[Number | None, Meta(description=(
        'over `run_steps`, start-up included (null without it)'))] = None


class Candidate(_Part):
    """`confirmation.candidates[]`: one candidate re-measured against the baseline."""

    trial: Annotated[int | None, Meta(description='its trial')] = None
    config: Annotated[dict[str, Any] | None, Meta(description='its configuration')] = None
    baseline: Annotated[list[Number] | None, Meta(description="the baseline's throughput, round by round")] = None
    candidate: Annotated[list[Number] | None, Meta(description="the candidate's, round by round")] = None
    speedup: Annotated[Number | None, Meta(description='the paired speed-up')] = None
    ci_low: Annotated[Number | None, Meta(description='its interval, low end')] = None
    ci_high: Annotated[Number | None, Meta(description='and high end')] = None
    faster: Annotated[bool | None, Meta(description='the interval lies above `1 + min_gain`')] = None
    rounds: Annotated[int | None, Meta(description='rounds it took')] = None
    level: Annotated[Number | None, Meta(description='confidence of its interval (widened for the looks)')] = None
    decided_by: Annotated[str | None, Meta(description=(
        '`cleared`, `below`, `round budget`, `time budget` or `failed`'))] = None
    startup: Annotated[Startup | None, Meta(description='its start-up cost, where it compiles')] = None


class Confirmation(_Part):
    """`confirmation`: the interleaved re-measurement of the best candidates (null when none ran)."""

    rounds: Annotated[int | None, Meta(description='rounds used')] = None
    max_rounds: Annotated[int | None, Meta(description='`--confirm-rounds`')] = None
    min_rounds: Annotated[int | None, Meta(description='`--confirm-min-rounds`')] = None
    budget_s: Annotated[Number | None, Meta(description='`--confirm-budget`')] = None
    confidence: Annotated[Number | None, Meta(description='of the intervals')] = None
    min_gain: Annotated[Number | None, Meta(description='`--min-gain`')] = None
    candidates: Annotated[list[Candidate] | None, Meta(description='the candidates')] = None


class Recommendation(_Part):
    """`recommendation`: the answer (null: interrupted before the confirmation ended)."""

    status: Annotated[str | None, Meta(description=(
        '`faster`, `keep-current`, or `undecided` (a budget ended the confirmation of a candidate that measured '
        'faster before its interval cleared; `best.yaml` keeps the current settings)'))] = None
    trial: Annotated[int | None, Meta(description='the trial recommended (null: keep current)')] = None
    config: Annotated[dict[str, Any] | None, Meta(description='the knobs it changes (`best.yaml`)')] = None
    speedup: Annotated[Number | None, Meta(description='its confirmed speed-up')] = None
    ci_low: Annotated[Number | None, Meta(description='its interval, low end')] = None
    ci_high: Annotated[Number | None, Meta(description='and high end')] = None
    rounds: Annotated[int | None, Meta(description='`faster`: the confirmation rounds the candidate took')] = None
    line: Annotated[str | None, Meta(description='the answer in one line')] = None
    hint: Annotated[str | None, Meta(description=(
        '`faster`: what to try next when a value is the largest searched'))] = None
    startup: Annotated[Startup | None, Meta(description='`faster`: its start-up cost (null: nothing compiled)')] = None
    candidate: Annotated[dict[str, Any] | None, Meta(description=(
        '`undecided`: the candidate left open (`trial`, `config`, `speedup`, `ci_low`, `ci_high`, `rounds`, '
        '`decided_by`), not an answer'))] = None


class After(_Part):
    """`after`: the recommendation profiled (null without one)."""

    verdict: Annotated[str | None, Meta(description='its verdict')] = None
    fractions: Annotated[dict[str, Number | None] | None, Meta(description=(
        "each class's share of its step time"))] = None
    step_time_us: Annotated[Number | None, Meta(description="the profiled steps' window over steps")] = None
    summary: Annotated[str | None, Meta(description='its `summary.json`, relative to the output folder')] = None
    report: Annotated[str | None, Meta(description='its `report.html`')] = None
    diff: Annotated[str | None, Meta(description='`diff.html`: baseline against it')] = None


class TuneCost(_Part):
    """`cost` (`--price-per-hour`): USD per 1,000 samples (or steps) before and after; the
    saving's interval is the speed-up's (`docs/tune.md`, "Objective")."""

    price_per_hour: Annotated[Number | None, Meta(description='USD an hour per device')] = None
    devices: Annotated[int | None, Meta(description='GPUs (a rank each), or machines for CPU runs')] = None
    per: Annotated[str | None, Meta(description='`1000 samples`, or `1000 steps` where the batch size is unknown')] = None
    baseline: Annotated[Number | None, Meta(description="the user's own configuration")] = None
    best: Annotated[Number | None, Meta(description='the proven faster one (null: none)')] = None
    saving: Annotated[Number | None, Meta(description='1 - best / baseline = 1 - 1 / speed-up')] = None
    saving_low: Annotated[Number | None, Meta(description="1 - 1 / the speed-up interval's low end")] = None
    saving_high: Annotated[Number | None, Meta(description="1 - 1 / its high end")] = None


class TuneRecord(_Part):
    """The tuning record (`tune.json`)."""

    schema: Annotated[str | None, Meta(description='always `"perfscope.tune"`')] = SCHEMA
    schema_version: Annotated[int | None, Meta(description='`1`')] = SCHEMA_VERSION
    perfscope_version: Annotated[str | None, Meta(description='version that wrote it')] = None
    generated_at: Annotated[str | None, Meta(description='ISO 8601 UTC time of writing')] = None
    script: Annotated[str | None, Meta(description='the tuned script')] = None
    args: Annotated[list[str] | None, Meta(description='its arguments')] = None
    nproc_per_node: Annotated[int | None, Meta(description='ranks per trial (`--nproc-per-node`)')] = None
    study: Annotated[Study | None, Meta(description='the study')] = None
    objective: Annotated[Objective | None, Meta(description='what a value measures')] = None
    baseline: Annotated[Baseline | None, Meta(description='the user\'s own configuration')] = None
    space: Annotated[Space | None, Meta(description='what is searched')] = None
    trials: Annotated[list[Trial] | None, Meta(description=(
        'every trial run (a duplicate proposal, never run, is left out)'))] = None
    importances: Annotated[dict[str, Number] | None, Meta(description=(
        "Optuna's fANOVA importances over the complete trials (null: too few)"))] = None
    confirmation: Annotated[Confirmation | None, Meta(description='the confirmation')] = None
    recommendation: Annotated[Recommendation | None, Meta(description='the answer')] = None
    cost: Annotated[TuneCost | None, Meta(description='*with `--price-per-hour`*: the cost before and after')] = None
    after: Annotated[After | None, Meta(description='the recommendation profiled')] = None
    decided_by: Annotated[str | None, Meta(description=(
        'what ended the run: `confirmation` (its rounds gave the answer), `search` (no trial to confirm: keep '
        'the current settings) or `interrupted` (Ctrl-C or SIGTERM before the answer: no `best.yaml`)'))] = None
    resume: Annotated[str | None, Meta(description=(
        '`interrupted`: the command that resumes it (finished trials are kept), passwords masked'))] = None
    notes: Annotated[list[str] | None, Meta(description=(
        'what the run could not do, or did differently, and why'))] = None
    best_config: Annotated[str | None, Meta(description=(
        '`best.yaml`, relative to the output folder where it is inside it'))] = None


# The objects of the record in the order the docs list them: (path, struct).
SECTIONS = (
    ("", TuneRecord), ("study", Study), ("objective", Objective), ("baseline", Baseline), ("space", Space),
    ("space.searched[]", SearchedKnob), ("trials[]", Trial), ("trials[].failure", Failure),
    ("trials[].numerics", Numerics), ("trials[].memory", TrialMemory), ("trials[].window", Window),
    ("trials[].threads", Threads), ("confirmation", Confirmation), ("confirmation.candidates[]", Candidate),
    ("recommendation", Recommendation), ("recommendation.startup", Startup), ("cost", TuneCost), ("after", After),
)
