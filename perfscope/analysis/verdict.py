"""The run's verdict and its advice: the step rule (:mod:`perfscope.analysis.classify`) applied to
the run's total time, and the knobs that address what it names, fitted to what the analysis found.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfscope.analysis.classify import VERDICTS, classify, cost_fractions  # noqa: F401 - re-exported
from perfscope.classes import ADVICE, CLASSES, COSTS, KNOBS, THRESHOLDS  # noqa: F401 - the one table, re-exported
from perfscope.record.schema import Facts

# The launch advice for a run that already replays CUDA graphs: graphs are not a new idea to it.
_LAUNCH_WITH_GRAPHS = ("Launch less often: a larger batch per step or gradient accumulation, capture more of the step "
                       "in the CUDA graphs it already replays, fused/foreach optimizers and fused operators to cut the "
                       "number of small kernels.")
HOST_CONTENDED_ADVICE = ("Give the training process the CPU it needs: run on a quieter machine, or use fewer intra-op "
                         "threads and DataLoader workers than there are cores (torch.set_num_threads, num_workers); "
                         "then profile again.")

# At least this share of the communication time in point-to-point or all-to-all operations makes
# them the comm advice's subject: gradient buckets no longer describe the wait.
P2P_SHARE = 0.5
_P2P_ADVICE = ("Most communication time is point-to-point SendRecv or all-to-all (pipeline stages' activations, "
               "expert or embedding exchanges), which DDP's gradient buckets do not touch: overlap it with compute "
               "(more micro-batches per pipeline step, an interleaved schedule, all-to-all on its own stream), balance "
               "the stages or experts so none waits, and send less (bf16 activations, fewer tokens per exchange).")


# The compute advice's channels_last clause, by mode (perfscope.classes): left out where the trace
# shows no convolution (channels_last only changes how convolutions read their input).
CHANNELS_LAST_CLAUSE = {"gpu": ", channels_last for convolutions (channels_last: true)",
                        "cpu": ", channels_last for convolutions"}


def _loader_cores(facts: Facts) -> tuple[int, int] | None:
    """``(num_workers, cores a rank)`` of the script's first DataLoader (``facts.loader``, what
    ``perfscope profile`` recorded; the node's cores are shared by its ranks), or None unknown."""
    if facts.loader is None:
        return None
    workers, cores = facts.loader.num_workers, facts.loader.cores
    if not (isinstance(workers, int) and isinstance(cores, int) and cores > 0):
        return None
    ranks = facts.job.local_world_size if facts.job else None
    return workers, (max(1, cores // ranks) if isinstance(ranks, int) and ranks > 0 else cores)


def _io_advice(text: str, facts: Facts) -> str:
    """The io advice fitted to the loader the script has: workers that already meet the
    process's cores cannot be helped by more."""
    found = _loader_cores(facts)
    if found is None:
        return text
    workers, per_rank = found
    if workers < per_rank:
        return f"The DataLoader has {workers} worker(s) for {per_rank} core(s) a rank. {text}"
    return (f"The DataLoader already has {workers} workers for {per_rank} core(s) a rank: more workers only "
            "share the same cores. Cut the cost of each sample instead -- cache or precompute what the dataset "
            "decodes and transforms, vectorise the transform or move it to the GPU, read larger records -- and "
            f"keep num_workers near {per_rank} (perfscope tune searches below your setting too).")


# FSDP's knobs (PyTorch's FSDP documentation): its all-gathers and reduce-scatters are the traffic,
# and DDP's bucket_cap_mb and no_sync do not exist for it.
_FSDP_ADVICE = {
    2: ("The job shards with FSDP2 (fully_shard): overlap its all-gathers and reduce-scatters with compute -- prefetch "
        "more layers ahead (module.set_modules_to_forward_prefetch / set_modules_to_backward_prefetch), keep the "
        "root's parameters gathered after forward (reshard_after_forward=False on the root or the last layers: "
        "fewer all-gathers for more memory; `reshard_after_forward: false` in a --config file sets it on every "
        "fully_shard call, and perfscope tune tries it), shard larger units (fully_shard fewer, bigger blocks), and with "
        "gradient accumulation skip the reduce-scatter on all but the last micro-batch "
        "(set_requires_gradient_sync(False))."),
    1: ("The job shards with FSDP (FullyShardedDataParallel): overlap its all-gathers and reduce-scatters with compute "
        "-- forward_prefetch=True and backward_prefetch=BACKWARD_PRE, sharding_strategy=SHARD_GRAD_OP (no all-gather "
        "in backward, for more memory), a wrapping policy with larger units, and with gradient accumulation "
        "no_sync() on all but the last micro-batch."),
}


def _comm_case(facts: Facts) -> str:
    """Which comm advice the job gets: ``fsdp1``, ``fsdp2``, ``p2p``, ``nodes`` or ``ddp``."""
    if facts.fsdp in _FSDP_ADVICE:
        return f"fsdp{facts.fsdp}"
    share = facts.p2p_comm_share
    if isinstance(share, (int, float)) and share >= P2P_SHARE:
        return "p2p"
    nodes = facts.job.nnodes if facts.job else None
    return "nodes" if isinstance(nodes, int) and nodes > 1 else "ddp"


def _comm_advice(text: str, facts: Facts) -> str:
    """The comm advice fitted to the job: FSDP's knobs for an FSDP job, point-to-point traffic,
    or a job over several nodes."""
    case = _comm_case(facts)
    if case.startswith("fsdp"):
        return _FSDP_ADVICE[int(case[-1])]
    if case == "p2p":
        return _P2P_ADVICE
    if case == "nodes":
        nodes = facts.job.nnodes
        return (f"The job spans {nodes} nodes, and the link between them is the slow one: turn on hierarchical_allreduce "
                "(reduce within each node first, so one copy per node crosses the link; perfscope tune tries it) and run "
                f"perfscope forecast on this output to see the step at other link speeds. Then: {text[0].lower()}{text[1:]}")
    return text


# The configuration keys of the comm advice by case (_comm_case): FSDP2's one key; FSDP1 and
# point-to-point traffic have none (their advice is about the script's own calls).
_COMM_KNOBS = {"fsdp2": ("reshard_after_forward",), "fsdp1": (), "p2p": ()}


def knobs_for(cls: str, mode: str, facts: Facts | None = None) -> tuple[str, ...]:
    """The configuration keys :func:`advice_for` names for a class, fitted to the same facts and
    in its order (the base lists are :data:`perfscope.classes.KNOBS`): the knob of a measured
    what-if (``fused_ops`` for window attention, ``optimizer_impl`` for a for-loop optimizer step)
    comes first, and on a GPU so do ``compile`` for a CUDA-graphs what-if and ``channels_last`` for a
    layout-transpose one; ``compile`` leaves the GPU launch keys of a run that replays CUDA graphs,
    ``channels_last`` the compute keys of a run without convolutions; an FSDP2 job's comm key is
    ``reshard_after_forward`` (FSDP1 and point-to-point traffic: none), and a multi-node job's
    starts with ``hierarchical_allreduce``; a loader whose workers already meet the cores has no
    io key (the advice is the cost of each sample).

    Returns:
        Keys of :class:`perfscope.runtime.config.AccelConfig`; empty where the advice names none.
    """
    facts = facts or Facts()
    keys = list(KNOBS[(cls, mode)])
    if cls == "comm":
        case = _comm_case(facts)
        if case in _COMM_KNOBS:
            return _COMM_KNOBS[case]
        if case == "nodes":
            keys = ["hierarchical_allreduce", *(k for k in keys if k != "hierarchical_allreduce")]
    elif cls == "io":
        found = _loader_cores(facts)
        if found is not None and found[0] >= found[1]:
            return ()
    elif cls == "launch" and mode == "gpu" and facts.cuda_graphs:
        keys.remove("compile")
    elif cls == "compute" and facts.convolutions is False:
        keys.remove("channels_last")
    if cls in ("launch", "compute"):
        first = [key for key, _ in _what_ifs(cls, mode, facts)]
        keys = [*first, *(k for k in keys if k not in first)]
    return tuple(keys)


def advice_for(cls: str, mode: str, facts: Facts | None = None) -> str:
    """The advice line of a class, fitted to what the trace showed.

    Args:
        cls: ``io``, ``comm``, ``launch`` or ``compute``.
        mode: ``"gpu"`` or ``"cpu"``.
        facts: What the analysis found; ``cuda_graphs`` (the run replays CUDA graphs) drops the
            advice to start using them; ``window_attention`` (a fusable pattern,
            :func:`perfscope.analysis.patterns.window_attention_cost`) puts the fused operator,
            with its what-if, first in the launch and compute advice, and so does
            ``optimizer_step`` (:func:`perfscope.analysis.optimizer_step.optimizer_step_cost`:
            a for-loop optimizer step taking a large share); ``no_tensor_cores`` (the
            compute capability of a GPU that ran no Tensor Core kernel) leads the GPU compute
            advice with that finding; ``p2p_comm_share`` (of communication time in send/recv and
            all-to-all, at least :data:`P2P_SHARE`) makes the comm advice about those, and
            ``job.nnodes`` above 1 puts the hierarchical all-reduce and ``perfscope forecast`` first;
            ``convolutions`` False (no convolution in the trace) leaves channels_last out of the
            compute advice; ``loader`` (the script's first DataLoader: workers and the
            process's cores) makes the io advice say how many workers it has, and, where they
            already meet the cores a rank has, turns it to the cost of each sample; ``fsdp`` (1 or
            2: the trace holds FSDP's ranges) makes the comm advice FSDP's knobs, not DDP's.
    """
    facts = facts or Facts()
    text = _LAUNCH_WITH_GRAPHS if cls == "launch" and mode == "gpu" and facts.cuda_graphs else ADVICE[(cls, mode)]
    if cls == "compute" and facts.convolutions is False:  # no convolution ran: no channels_last
        text = text.replace(CHANNELS_LAST_CLAUSE[mode], "")
    if cls == "comm":
        return _comm_advice(text, facts)
    if cls == "io":
        return _io_advice(text, facts)
    cap = facts.no_tensor_cores
    if cls == "compute" and mode == "gpu" and cap:
        text = (f"No kernel ran on Tensor Cores, though this GPU has them (compute capability {cap:.1f}): its matmuls "
                f"and convolutions ran on the slower fp32 units. {text}")
    first = [line for _, line in _what_ifs(cls, mode, facts)] if cls in ("launch", "compute") else []
    return f"{' '.join(first)} Then: {text[0].lower()}{text[1:]}" if first else text


def _what_ifs(cls: str, mode: str, facts: Facts) -> list[tuple[str, str]]:
    """``(configuration key, advice sentence)`` of the knobs whose what-if the profile measured, in
    this order: the fused window attention, the fused optimizer step, and on a GPU CUDA graphs
    (launch advice) and channels-last (compute advice); those that do not apply are left out."""
    from perfscope.analysis import optimizer_step, patterns, what_ifs

    lines = [("fused_ops", patterns.advice_line(facts.window_attention)),
             ("optimizer_impl", optimizer_step.advice_line(facts.optimizer_step))]
    if mode == "gpu" and cls == "launch":
        lines.append(("compile", what_ifs.graphs_line(facts.graphs, bool(facts.cuda_graphs))))
    if mode == "gpu" and cls == "compute":
        lines.append(("channels_last", what_ifs.transpose_line(facts.layout_transposes)))
    return [(key, line) for key, line in lines if line]


@dataclass(frozen=True)
class RunVerdict:
    """The run's verdict.

    Attributes:
        verdict: The step rule applied to ``fractions``: what removing would save the most time
            over the whole run. None when no step has the evidence for a verdict.
        runner_up: The next class by cost (None without a verdict, or where no other class has
            a share).
        fractions: Each class's (and ``other``'s) share of the total time of the counted steps,
            i.e. the step-time-weighted mean of the step costs (``{}`` without a verdict).
        step_share: Fraction of counted steps with each verdict.
        advice: One line naming the knobs that address the verdict (or, without one, what to do
            to get one).
        reason: Why there is no verdict; None when there is one.
        other_largest: ``other`` (GPU idle waiting on dependencies) is the largest share, larger
            than the class the verdict names: the headline must say so.
        provisional: No step had clean evidence; the verdict classifies the steps that waited
            for cores with that wait taken out (:mod:`perfscope.analysis.provisional`).
        core_wait_share: For a provisional verdict, the waits' share of those steps' wall time
            (0..1); None otherwise.
    """

    verdict: str | None
    runner_up: str | None
    fractions: dict
    step_share: dict
    advice: str
    reason: str | None = None
    other_largest: bool = False
    provisional: bool = False
    core_wait_share: float | None = None


def no_verdict(reason: str, advice: str) -> RunVerdict:
    """The run verdict when no step can be classified (``reason`` says why)."""
    return RunVerdict(None, None, {}, {VERDICTS[c]: 0.0 for c in CLASSES}, advice, reason)


def run_verdict(verdicts: np.ndarray, costs: pd.DataFrame, step_time_us: np.ndarray, mode: str,
                facts: Facts | None = None) -> RunVerdict:
    """Combine steps into the run's verdict.

    The run is judged on its total time, not on a vote of steps: with DataLoader workers, most
    steps find a batch ready and a few wait long for one, and those few decide the throughput.

    Args:
        verdicts: Verdicts of the steps that count (steps with status ``ok``, all ranks).
        costs: Their :func:`cost_fractions` rows.
        step_time_us: Their step times (microseconds), the weights.
        mode: ``"gpu"`` or ``"cpu"`` (selects the advice wording).
        facts: What the analysis found that changes the advice (:func:`advice_for`).

    Raises:
        ValueError: no steps given (use :func:`no_verdict`).
    """
    if len(verdicts) == 0:
        raise ValueError("no steps to classify")
    weights = np.asarray(step_time_us, dtype=float)
    if weights.sum() <= 0:
        weights = np.ones_like(weights)
    cols = [f"{c}_cost_frac" for c in (*CLASSES, "other")]
    total = pd.DataFrame([np.average(costs[cols].to_numpy(dtype=float), axis=0, weights=weights)], columns=cols)
    verdict, runner_up = classify(total)
    best = verdict[0].removesuffix("-bound")
    fractions = {c: float(total[f"{c}_cost_frac"].iloc[0]) for c in (*CLASSES, "other")}
    return RunVerdict(
        verdict=verdict[0],
        runner_up=runner_up[0],
        fractions=fractions,
        step_share={VERDICTS[c]: float(np.mean(verdicts == VERDICTS[c])) for c in CLASSES},
        advice=advice_for(best, mode, facts),
        other_largest=fractions["other"] > max(fractions[c] for c in CLASSES),
    )
