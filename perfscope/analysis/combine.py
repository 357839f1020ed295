"""Combining the per-file results of one run (:class:`~perfscope.analysis.rank_trace.RankTrace`) into
its :class:`Analysis`: one per-step frame of every rank, the verdict, the details, the notes.

The same whichever executor produced the per-file results (:mod:`perfscope.analysis.run`).
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from perfscope.analysis import evidence as ev
from perfscope.analysis import job
from perfscope.analysis.details import build_details
from perfscope.analysis.gpu_efficiency import no_tensor_cores
from perfscope.analysis.host_cpu import cpu_sources
from perfscope.analysis.memory import memory_warnings
from perfscope.analysis.notes import provisional_note, sparse_steps_note, status_notes, verdict_of_none
from perfscope.analysis.optimizer_step import optimizer_step_cost
from perfscope.analysis.patterns import window_attention_cost
from perfscope.analysis.what_ifs import graphs_cost, transpose_cost
from perfscope.analysis.provisional import SPIN_ADVICE_LINE, provisional_verdict, spin_reason, spin_verdict, waitfree
from perfscope.analysis.rank_trace import RankTrace
from perfscope.analysis.run_view import read_run_records
from perfscope.analysis.summary import Analysis
from perfscope.record.schema import Details, Facts, JobLayout, TraceEntry
from perfscope.analysis.telemetry import step_columns, throttle_warning
from perfscope.analysis.verdict import CLASSES, RunVerdict, classify, cost_fractions, no_verdict, run_verdict
from perfscope.fileid import fingerprint
from perfscope.record.host_steps import MEMORY_FIELDS, HostStep
from perfscope.steptime import WAITFREE
from perfscope.trace.kinds import (EventKind, fsdp_version, is_collective_range, is_comm_kernel, is_convolution,
                                   is_graph_launch)

NO_MARKERS_NOTE = "no ProfilerStep# markers: analyzed the whole trace as one window (step 0)"

# Time columns that are not parts of a step, so no share of it.
_NOT_SHARES = ("step_time_us", "cpu_span_us", "gpu_extended_span_us", "median_kernel_us", "median_operator_us")


def _with_fractions(metrics: pd.DataFrame) -> pd.DataFrame:
    step = metrics["step_time_us"].to_numpy(dtype=float)
    safe = np.where(step > 0, step, 1.0)
    fracs = {
        col[:-3] + "_frac": metrics[col].to_numpy(dtype=float) / safe
        for col in metrics.columns
        if col.endswith("_us") and col not in _NOT_SHARES
    }
    return pd.concat([metrics, pd.DataFrame(fracs, index=metrics.index)], axis=1)


def _trace_facts(rt: RankTrace, rank: int) -> TraceEntry:
    """The record's ``traces[]`` entry of one analyzed trace."""
    t = rt.table
    return TraceEntry(
        # absolute: a report rendered later from another directory still finds the file
        path=str(Path(t.path).absolute()) if t.path else None,
        fingerprint=fingerprint(t.path) if t.path else None,
        worker=t.worker, rank=rank, rank_source=t.rank_source, world_size=t.world_size, mode=rt.mode,
        events=t.n_events, has_step_markers=rt.has_markers, truncated=t.truncated,
        devices=[d.name for d in t.device_properties if d.name is not None],
        distributed_info=t.distributed_info, base_time_ns=t.base_time_ns, host_steps_recorded=len(t.host_steps),
        memory_capacity=t.memory_capacity, energy=dict(t.energy),
        warnings=t.warnings + rt.warnings, data_quality=rt.quality.to_list())


_NO_HOST_STEP = HostStep()
HOST_COLUMNS = {"wall_us": "host_wall_us", "thread_cpu_us": "host_thread_cpu_us",
                "process_cpu_us": "host_process_cpu_us", "run_queue_us": "host_run_queue_us",
                "machine_busy_us": "host_machine_busy_us", "workers_cpu_us": "host_workers_cpu_us",
                "cores": "host_cores", "energy_j": "host_energy_j",
                **{f: f for f in MEMORY_FIELDS}}


def _host_columns(rt: RankTrace) -> pd.DataFrame:
    """The host record of each step (``perfscope.record.host_steps``), NaN where the trace has none."""
    recs = [rt.table.host_steps.get(int(s), _NO_HOST_STEP) for s in rt.steps]
    frame = pd.DataFrame({col: [v if (v := getattr(r, f)) is not None else np.nan for r in recs]
                          for f, col in HOST_COLUMNS.items()}, index=rt.metrics.index)
    # e.g. no CUDA: no device columns; a record of an earlier version: no CPU split
    unmeasured = [c for c in (*MEMORY_FIELDS, "host_machine_busy_us", "host_workers_cpu_us", "host_cores",
                              "host_energy_j")
                  if frame[c].isna().all()]
    return frame.drop(columns=unmeasured)


def _rank_frame(rt: RankTrace, rank: int) -> pd.DataFrame:
    f = _with_fractions(rt.metrics)
    if rt.table.host_steps:
        f = pd.concat([f, _host_columns(rt)], axis=1)
    telemetry = step_columns(rt)
    if telemetry is not None:
        f = pd.concat([f, telemetry], axis=1)
    status = rt.evidence.status
    if rt.evidence.core_wait_us is not None:
        f["core_wait_us"] = rt.evidence.core_wait_us
        f["spin_bound_us"] = rt.evidence.spin_us
    front = {"rank": rank, "worker": rt.table.worker, "step": rt.steps, "status": status,
             "status_reason": pd.Series(rt.evidence.reason, dtype=object, index=f.index),
             "counted": status == ev.OK, "complete": status != ev.INCOMPLETE,
             "mode": rt.mode, "file": rt.table.path.name if rt.table.path else rt.table.worker}
    for i, (k, v) in enumerate(front.items()):
        f.insert(i, k, v)
    return f


def combine(rank_traces: list[RankTrace], run_info: dict | None = None, *, common_steps_only: bool = False) -> Analysis:
    """Reduce the per-file results of one run into its analysis (see :func:`analyze_tables`);
    the same whichever executor produced them."""
    job.check_world_sizes(rank_traces)
    run_records = read_run_records(rank_traces)  # first: what it leaves out joins the reading's warnings
    notes, warnings = _reading_notes(rank_traces)
    ranks = job.assign_ranks(rank_traces, warnings)
    job.check_markers(rank_traces, ranks)
    job.mark_cpu_ranks_of_a_gpu_run(rank_traces, warnings)
    notes.extend(job.missing_ranks(rank_traces, ranks) + job.windows_of_one_worker(rank_traces, ranks))
    frame = _run_frame(rank_traces, ranks, common_steps_only, notes)
    mode = "gpu" if (frame["mode"] == "gpu").any() else "cpu"
    frame, costs = _classified(frame)
    notes.extend(status_notes(frame))
    sparse = sparse_steps_note(frame, _main_thread_operators(rank_traces, ranks, frame))
    if sparse:
        notes.append(sparse)
    facts = _job_facts(rank_traces, ranks)
    counted = frame["counted"].to_numpy(dtype=bool)
    basis = _verdict_basis(frame, counted)
    # The verdict's steps on the verdict's clock: every figure derived from them uses that clock.
    steps = frame.loc[basis] if counted.any() else waitfree(frame.loc[basis])
    facts = msgspec.structs.replace(facts, **(_knob_facts(rank_traces, ranks, steps) if len(steps) else dict.fromkeys(KNOB_FACTS)))
    rv = _run_verdict(frame, costs, counted, steps, mode, facts, rank_traces, notes)
    if not counted.any() and basis.any() and not rv.provisional:
        # withheld where intra-op workers waited: no verdict, so no verdict's clock for the details
        basis = np.zeros(len(frame), dtype=bool)
        steps = frame.iloc[0:0]
        facts = msgspec.structs.replace(facts, **_knob_facts(rank_traces, ranks, frame.loc[frame["step_time_us"] > 0]))
    scope, shown = _scope(frame, counted, basis)
    details = build_details(rank_traces, ranks, steps if len(steps) else frame.loc[shown], mode, facts, run_records)
    details.scope = scope
    # who held the cores, where the verdict's steps waited for them
    contended = frame["status"].eq(ev.HOST_CONTENDED).to_numpy()
    details.host_cpu = cpu_sources(frame.loc[contended if contended.any() else basis])
    _detail_findings(details, notes, warnings)
    traces = [_trace_facts(rt, r) for rt, r in zip(rank_traces, ranks)]
    tables, timelines = _by_path(rank_traces)
    return Analysis(steps=frame, verdict=rv, mode=mode, traces=traces, notes=notes, warnings=warnings,
                    run_info=dict(run_info or {}), details=details, tables=tables, timelines=timelines)


def _run_frame(rank_traces: list[RankTrace], ranks: list[int], common_steps_only: bool, notes: list[str]) -> pd.DataFrame:
    """Every rank's steps in one frame, ordered by rank and step; steps checked across ranks."""
    frame = pd.concat([_rank_frame(rt, r) for rt, r in zip(rank_traces, ranks)], ignore_index=True)
    if rank_traces[0].has_markers:
        frame = job.check_steps(frame, common_steps_only, notes)
    return frame.sort_values(["rank", "step"], kind="stable").reset_index(drop=True).drop(columns="file")


def _scope(frame: pd.DataFrame, counted: np.ndarray, basis: np.ndarray) -> tuple[str, np.ndarray]:
    """What the detail tables describe, and its steps: the counted ones, the provisional verdict's,
    or, without a step the verdict rests on, the steps it left out (``withheld``)."""
    if basis.any():
        return ("counted" if counted.any() else "provisional"), basis
    return "withheld", (frame["step_time_us"] > 0).to_numpy()


def _by_path(rank_traces: list[RankTrace]) -> tuple[dict, dict]:
    """Each read file's table, and its step windows and partitions, by resolved path."""
    with_path = [rt for rt in rank_traces if rt.table.path is not None]
    return ({str(Path(rt.table.path).resolve()): rt.table for rt in with_path},
            {str(Path(rt.table.path).resolve()): (rt.windows, rt.partition_sets) for rt in with_path})


# The facts of the knobs' what-ifs, from the steps the verdict rests on (None without any).
KNOB_FACTS = ("window_attention", "optimizer_step", "graphs", "layout_transposes")


def _verdict_basis(frame: pd.DataFrame, counted: np.ndarray) -> np.ndarray:
    """The steps the verdict rests on: the counted ones, else those a provisional verdict
    classifies (host-contended steps whose waits for a core were measured)."""
    if counted.any() or "core_wait_us" not in frame.columns:
        return counted
    return (frame["status"].eq(ev.HOST_CONTENDED) & frame["core_wait_us"].notna()).to_numpy()


def _knob_facts(rank_traces: list[RankTrace], ranks: list[int], steps: pd.DataFrame) -> dict:
    """:data:`KNOB_FACTS` over ``steps``."""
    return {"window_attention": window_attention_cost(rank_traces, ranks, steps),
            "optimizer_step": optimizer_step_cost(rank_traces, ranks, steps),
            "graphs": graphs_cost(steps), "layout_transposes": transpose_cost(rank_traces, ranks, steps)}


def _reading_notes(rank_traces: list[RankTrace]) -> tuple[list[str], list[str]]:
    """(notes, warnings) of how each file was read: repairs, and files without step markers."""
    notes, warnings = [], []
    for rt in rank_traces:
        warnings.extend(rt.table.warnings + rt.warnings)
        if not rt.has_markers:
            notes.append(f"{rt.table.worker}: {NO_MARKERS_NOTE}")
    return notes, warnings


def _classified(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The frame with each step's class costs, ``verdict`` and ``runner_up`` (None for steps not
    counted), and the costs alone."""
    costs = pd.concat(
        [cost_fractions(frame[frame["mode"] == m], m) for m in ("gpu", "cpu") if (frame["mode"] == m).any()]
    ).loc[frame.index]
    verdict, runner_up = classify(costs)
    counted = frame["counted"].to_numpy(dtype=bool)
    frame = pd.concat([frame, costs], axis=1)
    # object columns: a step without a verdict holds None (pandas would make a string column's None NaN)
    frame["verdict"] = pd.Series(np.where(counted, verdict, None), index=frame.index, dtype=object)
    frame["runner_up"] = pd.Series(np.where(counted, runner_up, None), index=frame.index, dtype=object)
    return frame, costs


# Point-to-point and all-to-all communication, by kernel or record-function name: pipeline stages'
# activations and expert/embedding exchanges, which gradient bucketing does not touch.
_P2P = re.compile(r"SendRecv|all_?to_?all|alltoall|\b(?:nccl|gloo|mpi|ucc):(?:send|recv)|ncclKernel_(?:Send|Recv)|"
                  r"ncclDevKernel_(?:Send|Recv)", re.IGNORECASE)


def p2p_comm_share(rank_traces: list[RankTrace]) -> float | None:
    """The share of communication time (NCCL/RCCL kernels on GPU traces, collective ranges on CPU
    ones) in point-to-point and all-to-all operations, over every trace; None without any."""
    total = p2p = 0.0
    for rt in rank_traces:
        t = rt.table
        comm = (t.kind == EventKind.KERNEL) & t.name_flag(is_comm_kernel) if rt.mode == "gpu" else (
            np.isin(t.kind, np.array([EventKind.CPU_OP, EventKind.ANNOTATION], dtype=np.int8)) & t.name_flag(is_collective_range))
        rows = np.flatnonzero(comm)
        if not rows.size:
            continue
        flag = np.fromiter((bool(_P2P.search(str(n))) for n in t.names), bool, len(t.names))[t.name_id[rows]]
        dur = t.dur_ns[rows].astype(np.float64)
        total += float(dur.sum())
        p2p += float(dur[flag].sum())
    return p2p / total if total > 0 else None


def _job_facts(rank_traces: list[RankTrace], ranks: list[int]) -> Facts:
    """What the advice and the forecast need of the job: CUDA graph replays, and what perfscope
    profile recorded of DDP and the job's layout (:mod:`perfscope.record.job_facts`), in rank order;
    the knobs' what-ifs come later (:func:`_knob_facts`)."""
    by_rank = [rt for _, rt in sorted(zip(ranks, rank_traces), key=lambda p: p[0])]
    return Facts(
        cuda_graphs=any(rt.table.name_flag(is_graph_launch)[rt.table.kind == EventKind.RUNTIME].any() for rt in rank_traces),
        ddp=next((rt.table.ddp for rt in by_rank if rt.table.ddp), None),
        loader=next((rt.table.loader for rt in by_rank if rt.table.loader), None),
        job=next((JobLayout(nnodes=rt.table.node.nnodes, local_world_size=rt.table.node.local_world_size)
                  for rt in by_rank if rt.table.node), None),
        no_tensor_cores=no_tensor_cores(rank_traces),
        # channels_last is advice for convolutions only (a transformer's compute advice leaves it out)
        convolutions=any(rt.table.name_flag(is_convolution).any() for rt in rank_traces),
        # FSDP's communication has FSDP's knobs, not DDP's buckets
        fsdp=max((v for v in (fsdp_version(rt.table.names) for rt in rank_traces) if v), default=None),
        p2p_comm_share=p2p_comm_share(rank_traces))


def _run_verdict(frame: pd.DataFrame, costs: pd.DataFrame, counted: np.ndarray, steps: pd.DataFrame, mode: str,
                 facts: Facts, rank_traces: list[RankTrace], notes: list[str]) -> RunVerdict:
    """The run's verdict over the counted steps; else the provisional one over ``steps`` (the
    contended steps without their waits, :func:`waitfree`: its per-step verdicts and each step's
    wait-free time and shares go into ``frame``, its note into ``notes``); else none, with why."""
    if counted.any():
        return run_verdict(frame.loc[counted, "verdict"].to_numpy(), costs.loc[counted],
                           frame.loc[counted, "step_time_us"].to_numpy(), mode, facts)
    provisional = provisional_verdict(steps, frame, mode, facts)
    if provisional is None:
        return verdict_of_none(frame, [rt.evidence.run_reason for rt in rank_traces])
    other_end = spin_verdict(steps, mode, facts)
    if other_end is not None and other_end.verdict != provisional[0].verdict:
        return no_verdict(spin_reason(provisional[0].verdict, other_end.verdict, steps), SPIN_ADVICE_LINE)
    rv, per_step = provisional
    frame["provisional_verdict"] = pd.Series(None, index=frame.index, dtype=object)
    frame.loc[per_step.index, "provisional_verdict"] = per_step
    for col in ["step_time_us", "work_keep", *(f"{c}_cost_frac" for c in (*CLASSES, "other"))]:
        frame[WAITFREE + col] = np.nan
        frame.loc[steps.index, WAITFREE + col] = steps[col]
    notes.append(provisional_note(rv, int(len(per_step))))
    return rv


def _main_thread_operators(rank_traces: list[RankTrace], ranks: list[int], frame: pd.DataFrame) -> pd.Series:
    """Per row of ``frame``, the operators its trace recorded on the training thread in the step's
    CPU span (NaN for a step of no analyzed trace)."""
    out = pd.Series(np.nan, index=frame.index)
    for rt, rank in zip(rank_traces, ranks):
        t, w = rt.table, rt.windows
        ops = np.sort(t.ts_ns[(t.kind == EventKind.CPU_OP) & (t.thread_id == w.main_thread)])
        count = np.searchsorted(ops, w.cpu_end, side="left") - np.searchsorted(ops, w.cpu_start, side="left")
        per_step = dict(zip(w.step.tolist(), count.tolist()))
        mine = (frame["rank"] == rank) & (frame["worker"] == t.worker)
        out[mine] = frame.loc[mine, "step"].map(per_step)
    return out


def _detail_findings(details: Details, notes: list[str], warnings: list[str]) -> None:
    """The run-level details' problems, as warnings and notes."""
    warnings.extend(details.nodes.problems if details.nodes else [])
    warnings.extend(memory_warnings(details.memory))
    throttled = throttle_warning(details.telemetry)
    if throttled:
        warnings.append(throttled)
    if details.collectives_unmatched_reason:
        notes.append(f"ranks are not compared at their collectives (no lateness, no straggler from arrivals): "
                     f"{details.collectives_unmatched_reason}")
    if details.clocks_agree is False:
        warnings.append("the ranks' clocks do not agree (in most collectives a rank seems to arrive after another has "
                        "finished: a trace without its base time, or node clocks apart): arrivals are not compared, the "
                        "straggler is the rank that waits least in collectives")
