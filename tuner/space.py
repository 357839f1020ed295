"""The search space, shaped by the baseline's profile and by what the run can use.

Each knob of the runtime configuration (:class:`perfscope.runtime.config.AccelConfig`) belongs to
a group named after the bottleneck it removes. The space holds the knobs that can apply to this run
(a GPU, a process group, a DataLoader, ``perfscope.accelerate`` in the script) and whose group's
bottleneck takes a visible share of the baseline's step time; every knob left out keeps a reason.

Trial parameters use Optuna distributions. A parameter's *baseline* value is what the script does
on its own (read from the baseline run), so the baseline is a point of the space, and a trial's
configuration holds only the knobs that differ from it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    distribution_to_json,
    json_to_distribution,
)

from perfscope.runtime.config import AccelConfig, config_from_dict

GROUPS = ("input", "precision", "communication", "launch")
# The verdict whose removable cause each group attacks, and the summary fraction measuring it.
GROUP_VERDICT = {"input": "io-bound", "precision": "compute-bound", "communication": "comm-bound", "launch": "launch-bound"}
GROUP_FRACTION = {"input": "io", "precision": "compute", "communication": "comm", "launch": "launch"}
# A group whose bottleneck takes less of the baseline's step time than this is not searched: its
# best case (removing all of it) is within a trial's measurement noise on a shared machine.
MIN_GROUP_SHARE = 0.05
DDP_DEFAULT_BUCKET_MB = 25.0  # torch.nn.parallel.DistributedDataParallel's default bucket_cap_mb


@dataclasses.dataclass(frozen=True)
class Knob:
    """One searched parameter.

    Attributes:
        name: The :class:`AccelConfig` key.
        groups: Bottleneck groups it serves (searched when any of them is).
        distribution: Its Optuna distribution.
        baseline: The value the script runs with on its own.
        when: ``(parent, values)``: only suggested when the parent knob takes one of ``values``
            (prefetch_factor needs worker processes); otherwise it keeps its baseline value.
    """

    name: str
    groups: tuple[str, ...]
    distribution: BaseDistribution
    baseline: object
    when: tuple[str, tuple] | None = None

    def choices_text(self) -> str:
        """The distribution in words, e.g. ``0..8`` or ``O0, O1, O2``."""
        d = self.distribution
        if isinstance(d, CategoricalDistribution):
            return ", ".join(map(str, d.choices))
        scale = " (log)" if getattr(d, "log", False) else ""
        return f"{d.low:g}..{d.high:g}{scale}"


@dataclasses.dataclass
class SearchSpace:
    """The knobs to search, in group order, and the knobs left out with reasons.

    Attributes:
        knobs: Searched knobs, the verdict's group first.
        excluded: knob -> why it is not searched.
        order: Groups by their share of the baseline's step time, largest first.
        verdict: The baseline's verdict the space was shaped by.
    """

    knobs: list[Knob]
    excluded: dict[str, str]
    order: list[str]
    verdict: str

    @property
    def baseline_params(self) -> dict:
        """The baseline as trial parameters."""
        return {k.name: k.baseline for k in self.knobs}

    @property
    def distributions(self) -> dict[str, BaseDistribution]:
        return {k.name: k.distribution for k in self.knobs}

    def suggest(self, trial: optuna.Trial) -> dict:
        """Ask the trial for every knob (conditional knobs only when their parent allows them)."""
        params: dict = {}
        for knob in self.knobs:
            if knob.when is not None and params.get(knob.when[0]) not in knob.when[1]:
                params[knob.name] = knob.baseline
                continue
            params[knob.name] = _suggest(trial, knob)
        return params

    def sample(self, rng: random.Random) -> dict:
        """Random parameters (uniform over each distribution; log-uniform where it is log)."""
        params: dict = {}
        for knob in self.knobs:
            d = knob.distribution
            if knob.when is not None and params.get(knob.when[0]) not in knob.when[1]:
                params[knob.name] = knob.baseline
            elif isinstance(d, CategoricalDistribution):
                params[knob.name] = rng.choice(list(d.choices))
            elif isinstance(d, IntDistribution):
                params[knob.name] = rng.randrange(d.low, d.high + 1, d.step)
            else:
                low, high = (math.log(d.low), math.log(d.high)) if d.log else (d.low, d.high)
                value = rng.uniform(low, high)
                params[knob.name] = math.exp(value) if d.log else value
        return params

    def at_top(self, changes: dict) -> list[Knob]:
        """The knobs that ``changes`` sets to the largest value of an ordered numeric range of two
        values or more (an integer range's high end; the largest of numeric choices): values beyond
        it were not tried."""
        top = []
        for knob in self.knobs:
            value, d = changes.get(knob.name), knob.distribution
            if value is None or isinstance(value, bool):
                continue
            if isinstance(d, CategoricalDistribution):
                numeric = [c for c in d.choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
                if len(numeric) == len(d.choices) >= 2 and value == max(numeric):
                    top.append(knob)
            elif isinstance(d, (IntDistribution, FloatDistribution)) and d.high > d.low and value >= d.high:
                top.append(knob)
        return top

    def to_config(self, params: dict) -> AccelConfig:
        """The configuration of a trial: only the knobs whose value differs from the baseline.

        Raises:
            ConfigError: an impossible combination (e.g. prefetch_factor without workers).
        """
        changes = {}
        for knob in self.knobs:
            if knob.name in params and params[knob.name] != knob.baseline:
                changes[knob.name] = params[knob.name]
        if not params.get("num_workers", _baseline(self, "num_workers")):
            changes.pop("prefetch_factor", None)  # meaningless without worker processes
        return config_from_dict(changes)

    def describe(self) -> dict:
        """JSON-able description (``tune.json``'s ``space``)."""
        return {
            "verdict": self.verdict,
            "order": list(self.order),
            "searched": [{"name": k.name, "group": k.groups[0], "choices": k.choices_text(), "baseline": k.baseline}
                         for k in self.knobs],
            "excluded": dict(self.excluded),
        }

    def to_json(self) -> str:
        """The whole space, to store in the study (every worker then searches the same one)."""
        return json.dumps({
            "verdict": self.verdict, "order": self.order, "excluded": self.excluded,
            "knobs": [{"name": k.name, "groups": list(k.groups), "distribution": distribution_to_json(k.distribution),
                       "baseline": k.baseline, "when": [k.when[0], list(k.when[1])] if k.when else None}
                      for k in self.knobs],
        })

    @classmethod
    def from_json(cls, text: str) -> SearchSpace:
        """Inverse of :meth:`to_json`."""
        data = json.loads(text)
        knobs = [Knob(name=k["name"], groups=tuple(k["groups"]), distribution=json_to_distribution(k["distribution"]),
                      baseline=k["baseline"], when=(k["when"][0], tuple(k["when"][1])) if k["when"] else None)
                 for k in data["knobs"]]
        return cls(knobs=knobs, excluded=data["excluded"], order=data["order"], verdict=data["verdict"])


def _baseline(space: SearchSpace, name: str):
    for knob in space.knobs:
        if knob.name == name:
            return knob.baseline
    return None


def _suggest(trial: optuna.Trial, knob: Knob):
    d = knob.distribution
    if isinstance(d, CategoricalDistribution):
        return trial.suggest_categorical(knob.name, d.choices)
    if isinstance(d, IntDistribution):
        return trial.suggest_int(knob.name, d.low, d.high, log=d.log)
    return trial.suggest_float(knob.name, d.low, d.high, log=d.log)


def group_shares(fractions: dict) -> dict[str, float]:
    """Each group's share of the baseline's step time, from the summary's ``overall.fractions``."""
    return {g: float(fractions.get(GROUP_FRACTION[g]) or 0.0) for g in GROUPS}


def build_space(facts: dict, fractions: dict, verdict: str, *, cpu_count: int | None = None) -> SearchSpace:
    """The search space for a run.

    Args:
        facts: What the baseline run showed (``facts`` of the measurement's rank 0 record; see
            ``perfscope.measure``): cuda, world_size, ddp, dataloader, accelerate, tf32...
        fractions: The baseline's ``overall.fractions`` (io, comm, launch, compute; shares of step
            time in [0, 1]).
        verdict: The baseline's run verdict (``io-bound`` ...).
        cpu_count: CPU cores on this node (default: ``os.cpu_count()``).

    Returns:
        The :class:`SearchSpace`; it may hold no knob (then there is nothing to tune, and
        ``excluded`` says why).
    """
    cpu = max(1, cpu_count or facts.get("cpu_count") or os.cpu_count() or 1)
    shares = group_shares(fractions)
    order = sorted(GROUPS, key=lambda g: (GROUP_VERDICT[g] != verdict, -shares[g]))
    searched_groups = {g for g in GROUPS if GROUP_VERDICT[g] == verdict or shares[g] >= MIN_GROUP_SHARE}
    candidates, excluded = _applicable_knobs(facts, cpu)
    knobs: list[Knob] = []
    for knob in candidates:
        if not searched_groups.intersection(knob.groups):
            group = knob.groups[0]
            excluded[knob.name] = (f"its bottleneck ({GROUP_FRACTION[group]}) takes only {shares[group]:.0%} of the "
                                   f"baseline's step time (searched from {MIN_GROUP_SHARE:.0%})")
            continue
        knobs.append(knob)
    knobs.sort(key=lambda k: min(order.index(g) for g in k.groups if g in searched_groups))
    return SearchSpace(knobs=knobs, excluded=excluded, order=order, verdict=verdict)


def _applicable_knobs(facts: dict, cpu: int) -> tuple[list[Knob], dict[str, str]]:
    """Knobs that can apply to this run, and the reasons for those that cannot."""
    knobs: list[Knob] = []
    excluded: dict[str, str] = {}
    cuda = bool(facts.get("cuda"))
    loader = facts.get("dataloader") or None
    acc = facts.get("accelerate") or {}
    uses_accelerate = bool(acc.get("called"))
    ddp = facts.get("ddp") or None
    world = int(facts.get("world_size") or 1)
    local_world = max(1, int(facts.get("local_world_size") or 1))

    # Input pipeline.
    if loader is None:
        for name in ("num_workers", "pin_memory", "prefetch_factor", "device_prefetch"):
            excluded[name] = "the script builds no torch DataLoader (none was iterated)"
    elif loader.get("iterable"):
        for name in ("num_workers", "prefetch_factor"):
            excluded[name] = "the DataLoader reads an IterableDataset: more workers would duplicate its samples"
    if loader is not None and not loader.get("iterable"):
        base_workers = int(loader.get("num_workers") or 0)
        # Workers mostly wait on I/O or decoding, so more than the cores can pay off; per rank, the
        # node's cores are shared by its ranks.
        high = max(base_workers, min(16, max(4, 2 * cpu // local_world)))
        knobs.append(Knob("num_workers", ("input",), IntDistribution(0, high), base_workers))
        base_pf = loader.get("prefetch_factor") or 2
        knobs.append(Knob("prefetch_factor", ("input",), CategoricalDistribution(sorted({2, 4, 8, int(base_pf)})),
                          int(base_pf), when=("num_workers", tuple(range(1, high + 1)))))
    if loader is not None:
        if cuda:
            knobs.append(Knob("pin_memory", ("input",), CategoricalDistribution([False, True]), bool(loader.get("pin_memory"))))
        else:
            excluded["pin_memory"] = "no GPU: there are no host-to-device copies to speed up"
    if loader is not None and not cuda:
        excluded["device_prefetch"] = "no GPU: there are no host-to-device copies to overlap"
    elif loader is not None and not (uses_accelerate and acc.get("loader")):
        excluded["device_prefetch"] = "needs the loader passed to perfscope.accelerate in the script"
    elif loader is not None:
        knobs.append(Knob("device_prefetch", ("input",), CategoricalDistribution([False, True]), False))
    excluded["persistent_workers"] = "only matters across epochs; a trial measures steps within one"
    # Host threads share the cores with the workers (perfscope/runtime/threads.py): searched with them.
    base_threads = int((facts.get("threads") or {}).get("intra_op_threads") or 0)
    if not base_threads:
        excluded["intra_op_threads"] = "the baseline run did not report its intra-op threads"
    else:
        per_rank = max(1, cpu // local_world)
        choices = sorted({1, max(1, per_rank // 2), per_rank, base_threads})
        if len(choices) < 2:
            excluded["intra_op_threads"] = f"one core per rank: the script already runs {base_threads} thread"
        else:
            knobs.append(Knob("intra_op_threads", ("input",), CategoricalDistribution(choices), base_threads))

    # Precision.
    if not uses_accelerate or not acc.get("optimizer"):
        # At launch only bf16 O1 (perfscope/runtime/launch_amp.py): fp16 scaling and O2 master
        # weights live in the training loop.
        if cuda and not facts.get("bf16_supported"):
            excluded["amp_level"] = ("this GPU has no bf16, and fp16 needs loss scaling: "
                                     "perfscope.accelerate(model, optimizer, ...) in the script")
        else:
            knobs.append(Knob("amp_level", ("precision",), CategoricalDistribution(["O0", "O1"]), "O0"))
            excluded["amp_level=O2"] = "fp32 master weights in the optimizer need perfscope.accelerate in the script"
            excluded["amp_dtype"] = ("bf16 at launch; fp16 needs loss scaling around backward: "
                                     "perfscope.accelerate in the script")
    else:
        levels = ["O0", "O1", "O2"] if cuda else ["O0", "O1"]
        knobs.append(Knob("amp_level", ("precision",), CategoricalDistribution(levels), "O0"))
        if not cuda:
            excluded["amp_level=O2"] = "no GPU: half-precision weights with fp32 masters only pay off on a GPU"
        dtypes = ["bf16", "fp16"] if cuda and facts.get("bf16_supported") else (["fp16"] if cuda else ["bf16"])
        if len(dtypes) > 1:
            knobs.append(Knob("amp_dtype", ("precision",), CategoricalDistribution(dtypes), "bf16",
                              when=("amp_level", ("O1", "O2"))))
        else:
            excluded["amp_dtype"] = f"only {dtypes[0]} is available here"
    if not cuda:
        excluded["tf32"] = excluded["cudnn_benchmark"] = "no GPU"
    else:
        capability = facts.get("cuda_capability") or [0, 0]
        if capability[0] >= 8:
            knobs.append(Knob("tf32", ("precision",), CategoricalDistribution([False, True]), bool(facts.get("tf32"))))
        else:
            excluded["tf32"] = "the GPU has no TF32 (needs compute capability 8.0 or newer)"
        knobs.append(Knob("cudnn_benchmark", ("precision", "launch"), CategoricalDistribution([False, True]),
                          bool(facts.get("cudnn_benchmark"))))

    # Communication.
    if ddp is None or world < 2:
        why = "no DistributedDataParallel model" if ddp is None else "a single rank: there is nothing to all-reduce"
        for name in ("bucket_cap_mb", "hierarchical_allreduce", "grad_compression", "static_graph"):
            excluded[name] = why
    else:
        base_bucket = float(ddp.get("bucket_cap_mb") or DDP_DEFAULT_BUCKET_MB)
        knobs.append(Knob("bucket_cap_mb", ("communication",),
                          CategoricalDistribution(sorted({1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, base_bucket})), base_bucket))
        nodes = world // local_world
        if nodes < 2:  # within a node every rank already reduces over the fastest link there is
            excluded["hierarchical_allreduce"] = (f"one node ({world} ranks on it): a hierarchical all-reduce "
                                                  "only pays off across nodes")
        else:
            knobs.append(Knob("hierarchical_allreduce", ("communication",), CategoricalDistribution([False, True]),
                              False))
        knobs.append(Knob("grad_compression", ("communication",), CategoricalDistribution(["none", "fp16", "bf16"]), "none"))
        knobs.append(Knob("static_graph", ("communication",), CategoricalDistribution([False, True]), bool(ddp.get("static_graph"))))

    # Accumulation: more work per optimizer step and per all-reduce (it changes the effective batch,
    # which the numerics guard watches).
    if uses_accelerate and acc.get("optimizer"):
        knobs.append(Knob("grad_accum_steps", ("launch", "communication"), CategoricalDistribution([1, 2, 4]), 1))
    else:
        excluded["grad_accum_steps"] = "needs perfscope.accelerate(model, optimizer, ...) and perfscope.backward in the script"
    return knobs, excluded


def rule_based_guess(space: SearchSpace, facts: dict, cpu_count: int | None = None,
                     fractions: dict | None = None) -> dict | None:
    """A first configuration from the verdict, as trial parameters (None when it equals the baseline).

    The rules follow PyTorch's performance tuning guide: io-bound -> enough workers to hide the
    measured loading share (``io / (1 - io)``, at least 2, within the space), the cores they leave
    as intra-op threads (at least one), pinned memory and deeper prefetch; compute-bound -> mixed precision, TF32
    and cuDNN autotuning; comm-bound -> larger buckets (fewer all-reduce calls) and bf16 gradient
    compression on GPUs; launch-bound -> accumulation of 2 micro-batches.
    """
    params = dict(space.baseline_params)
    names = set(params)
    cpu = max(1, cpu_count or facts.get("cpu_count") or os.cpu_count() or 1)
    local_world = max(1, int(facts.get("local_world_size") or 1))

    def put(name: str, value) -> None:
        if name in names:
            dist = space.distributions[name]
            if isinstance(dist, IntDistribution):
                value = max(dist.low, min(dist.high, int(value)))
            elif isinstance(dist, CategoricalDistribution) and value not in dist.choices:
                return
            params[name] = value

    verdict = space.verdict
    if verdict == "io-bound":
        # Enough workers to hide the loading: a step loads for `io` of its time and computes
        # for the rest, so about io / (1 - io) workers keep up (within the space's range).
        io = float((fractions or {}).get("io") or 0.0)
        wanted = math.ceil(io / max(1e-3, 1.0 - io)) if io > 0 else cpu // local_world
        put("num_workers", max(2, wanted))
        # Leave the workers their cores: the training process keeps what is left, at least one.
        workers = params.get("num_workers") or 0
        put("intra_op_threads", max(1, cpu // local_world - workers))
        put("prefetch_factor", 4)
        put("pin_memory", True)
        put("device_prefetch", True)
    elif verdict == "compute-bound":
        put("amp_level", "O1")
        put("amp_dtype", "bf16")
        put("tf32", True)
        put("cudnn_benchmark", True)
    elif verdict == "comm-bound":
        put("bucket_cap_mb", 100.0)
        if facts.get("cuda"):
            put("grad_compression", "bf16")
    elif verdict == "launch-bound":
        put("grad_accum_steps", 2)
        put("cudnn_benchmark", True)
    return None if params == space.baseline_params else params
