"""The search space: which knobs apply, how the verdict orders and shapes it, the guess, numerics."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import optuna
import pytest

from perfscope.tuner.confirm import confirm_candidates
from perfscope.tuner.numerics import check_losses
from perfscope.tuner.pruner import SlowerThanBestPruner
from perfscope.tuner.space import SearchSpace, build_space, rule_based_guess
from perfscope.tuner.prove import range_hint as _range_hint

CPU_LOADER = {"cuda": False, "cpu_count": 2, "world_size": 1, "local_world_size": 1,
              "dataloader": {"num_workers": 0, "pin_memory": False, "prefetch_factor": None, "iterable": False},
              "accelerate": {"called": False}, "ddp": None}
IO = {"io": 0.86, "comm": 0.0, "launch": 0.02, "compute": 0.12, "other": 0.0}
COMM = {"io": 0.0, "comm": 0.3, "launch": 0.02, "compute": 0.68, "other": 0.0}


def names(space: SearchSpace) -> list[str]:
    return [k.name for k in space.knobs]


def test_io_bound_cpu_script_searches_the_loader_and_says_why_the_rest_is_left_out():
    space = build_space(CPU_LOADER, IO, "io-bound")
    # compute holds 12% of the step: bf16 autocast is searched, applied at launch
    assert names(space) == ["num_workers", "prefetch_factor", "amp_level"]
    assert space.order[0] == "io"
    assert "no GPU" in space.excluded["pin_memory"]
    assert "perfscope.accelerate" in space.excluded["amp_level=O2"]
    assert "DistributedDataParallel" in space.excluded["bucket_cap_mb"]
    assert space.baseline_params == {"num_workers": 0, "prefetch_factor": 2, "amp_level": "O0"}
    guess = rule_based_guess(space, CPU_LOADER)
    assert guess["num_workers"] >= 2 and guess["prefetch_factor"] == 4


def test_comm_bound_ddp_run_searches_bucket_size_and_hierarchical_allreduce():
    facts = {"cuda": False, "cpu_count": 2, "world_size": 4, "local_world_size": 2, "dataloader": None,
             "accelerate": {"called": False}, "ddp": {"bucket_cap_mb": 25.0, "static_graph": False}}
    space = build_space(facts, COMM, "comm-bound")
    # 2 nodes of 2 ranks: the hierarchical all-reduce first (two values, the most to gain across nodes)
    assert names(space)[:2] == ["hierarchical_allreduce", "bucket_cap_mb"]
    assert space.baseline_params["bucket_cap_mb"] == 25.0
    assert "no torch DataLoader" in space.excluded["num_workers"]
    guess = rule_based_guess(space, facts)
    assert guess["bucket_cap_mb"] == 100.0 and guess["hierarchical_allreduce"] is True
    # The trial's configuration holds only what changes.
    assert space.to_config(guess).changes() == {"bucket_cap_mb": 100.0, "hierarchical_allreduce": True}


def test_one_node_or_one_rank_per_node_leaves_the_hierarchical_all_reduce_out_with_the_reason():
    base = {"cuda": False, "cpu_count": 2, "dataloader": None, "accelerate": {"called": False},
            "ddp": {"bucket_cap_mb": 25.0, "static_graph": False}}
    one_node = build_space({**base, "world_size": 4, "local_world_size": 4}, COMM, "comm-bound")
    assert "one node (4 ranks on it)" in one_node.excluded["hierarchical_allreduce"]
    assert "hierarchical_allreduce" not in rule_based_guess(one_node, {**base, "world_size": 4, "local_world_size": 4})
    per_node = build_space({**base, "world_size": 4, "local_world_size": 1}, COMM, "comm-bound")
    assert "one rank per node" in per_node.excluded["hierarchical_allreduce"]


def test_small_bottleneck_groups_are_left_out_with_their_share():
    facts = dict(CPU_LOADER, accelerate={"called": True, "optimizer": True, "loader": True})
    compute = {"io": 0.01, "comm": 0.0, "launch": 0.02, "compute": 0.97, "other": 0.0}
    space = build_space(facts, compute, "compute-bound")
    assert names(space)[0] == "amp_level"
    assert "1%" in space.excluded["num_workers"]
    assert "grad_accum_steps" in space.excluded  # launch 2% < 5%


def test_gpu_facts_open_the_gpu_knobs():
    facts = {"cuda": True, "cuda_capability": [9, 0], "bf16_supported": True, "cpu_count": 16, "world_size": 1,
             "dataloader": {"num_workers": 2, "pin_memory": False, "prefetch_factor": 2, "iterable": False},
             "accelerate": {"called": True, "optimizer": True, "loader": True}, "ddp": None,
             "tf32": False, "cudnn_benchmark": False}
    space = build_space(facts, {"io": 0.3, "compute": 0.6, "launch": 0.1}, "compute-bound")
    for name in ("amp_level", "amp_dtype", "tf32", "cudnn_benchmark", "pin_memory", "device_prefetch", "num_workers"):
        assert name in names(space), name
    assert space.order[:2] == ["compute", "io"]
    old = dict(facts, cuda_capability=[7, 0])
    assert "TF32" in build_space(old, {"compute": 1.0}, "compute-bound").excluded["tf32"]


def test_a_recommendation_at_the_top_of_a_searched_range_says_what_to_try_next():
    space = build_space(CPU_LOADER, IO, "io-bound")  # 2 cores: num_workers 0..4, prefetch_factor 2, 4, 8
    assert [k.name for k in space.at_top({"num_workers": 4, "prefetch_factor": 8})] == ["num_workers", "prefetch_factor"]
    assert [k.name for k in space.at_top({"num_workers": 4, "prefetch_factor": 4})] == ["num_workers"]
    assert space.at_top({"num_workers": 3, "prefetch_factor": 4}) == []
    assert _range_hint(space, {"num_workers": 3}) is None
    hint = _range_hint(space, {"num_workers": 4, "prefetch_factor": 8})
    assert hint.startswith("num_workers=4 and prefetch_factor=8 are the largest values searched "
                           "(num_workers 0..4; prefetch_factor 2, 4, 8)"), hint
    assert "2 per CPU core" in hint
    assert "CPU core" not in _range_hint(space, {"num_workers": 2, "prefetch_factor": 8})
    # A script already at 6 workers is searched up to its own value; switches (True/False) have no top.
    gpu = dict(CPU_LOADER, cuda=True, dataloader=dict(CPU_LOADER["dataloader"], num_workers=6))
    wide = build_space(gpu, IO, "io-bound")
    assert wide.at_top({"num_workers": 4}) == [] and [k.name for k in wide.at_top({"num_workers": 6})] == ["num_workers"]
    assert wide.at_top({"pin_memory": True, "device_prefetch": True}) == []


def test_iterable_dataset_keeps_workers_out():
    facts = dict(CPU_LOADER, dataloader=dict(CPU_LOADER["dataloader"], iterable=True))
    space = build_space(facts, IO, "io-bound")
    assert "duplicate" in space.excluded["num_workers"]
    assert [k.name for k in space.knobs] == ["amp_level"]  # the compute share's knob only


def test_space_round_trips_through_json_and_suggests_conditionally():
    space = build_space(CPU_LOADER, IO, "io-bound")
    again = SearchSpace.from_json(space.to_json())
    assert again.describe() == space.describe()
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=1))
    seen_zero = False
    for _ in range(30):
        trial = study.ask()
        params = again.suggest(trial)
        config = again.to_config(params)
        if params["num_workers"] == 0:
            seen_zero = True
            assert config.prefetch_factor is None  # no prefetch without workers
        study.tell(trial, 1.0)
    assert seen_zero


def test_numerics_guard():
    base = [2.30, 2.28, 2.25]
    assert check_losses(base, [2.31, 2.27, 2.26]).status == "ok"
    assert check_losses(base, [2.3, math.nan, 2.2]).status == "unsafe"
    assert check_losses(base, [5.0, 6.0, 7.0]).status == "unsafe"
    assert check_losses(base, [None, None]).status == "not-visible"
    assert check_losses([], [2.3]).status == "not-visible"


def test_pruner_stops_only_clearly_slower_trials_after_its_warmup():
    study = optuna.create_study(direction="maximize", pruner=SlowerThanBestPruner(ratio=0.7, warmup_steps=2))
    study.add_trial(optuna.trial.create_trial(value=100.0, user_attrs={"feasible": True}))
    study.add_trial(optuna.trial.create_trial(value=1000.0, user_attrs={"feasible": False}))  # unsafe: ignored
    slow, close = study.ask(), study.ask()
    slow.report(50.0, 0)
    assert not slow.should_prune()  # one step: too early
    slow.report(50.0, 1)
    assert slow.should_prune()
    close.report(80.0, 0)
    close.report(80.0, 1)
    assert not close.should_prune()
    with pytest.raises(ValueError):
        SlowerThanBestPruner(ratio=1.5)


def test_confirm_candidates_shares_the_baseline_and_drops_failed_candidates():
    calls = []

    def run(name, value):
        def f():
            calls.append(name)
            return value
        return f

    rng = iter([1.0, 1.01, 0.99, 1.02, 1.0])
    results = confirm_candidates(lambda: calls.append("B") or next(rng),
                                 {"fast": run("fast", 2.0), "broken": run("broken", None)}, rounds=5,
                                 min_rounds=5)
    assert calls[:3] == ["B", "fast", "broken"] and calls.count("broken") == 1 and calls.count("B") == 5
    assert results["broken"] is None
    assert results["fast"].faster and results["fast"].speedup == pytest.approx(2.0 / math.exp(
        sum(math.log(v) for v in [1.0, 1.01, 0.99, 1.02, 1.0]) / 5), rel=1e-9)


def test_samples_drawn_from_prefilled_queues_are_not_counted(tmp_path):
    import json

    from perfscope.measure.records import drawn_from_queues
    from perfscope.tuner.window import window_throughput

    lines = [{"step": 1, "seconds": 0.1, "samples": 16, "measured": False, "ready": 12},
             {"step": 2, "seconds": 0.01, "samples": 16, "measured": True, "ready": 10},
             {"step": 3, "seconds": 0.01, "samples": 16, "measured": True, "ready": 9},
             {"step": 4, "seconds": 0.01, "samples": 16, "measured": True, "ready": 7},
             {"step": 5, "seconds": 0.05, "samples": 16, "measured": False, "ready": 6}]
    path = tmp_path / "rank0.steps.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    # The queue fell from 10 ready batches (first measured step) to 6 (the step after the window).
    assert drawn_from_queues(path, 16, measure_steps=3) == 4 * 16
    assert drawn_from_queues(path, None, measure_steps=3) == 0  # batch size unknown
    assert window_throughput([16, 16, 16], [0.01] * 3, drawn=32) == pytest.approx(16 / 0.03)


def test_hierarchical_allreduce_is_left_out_on_one_node():
    facts = {"cuda": False, "cpu_count": 2, "world_size": 2, "local_world_size": 2, "dataloader": None,
             "accelerate": {"called": False}, "ddp": {"bucket_cap_mb": 25.0, "static_graph": False}}
    space = build_space(facts, COMM, "comm-bound")
    assert "hierarchical_allreduce" not in names(space) and "bucket_cap_mb" in names(space)
    assert "one node (2 ranks on it)" in space.excluded["hierarchical_allreduce"]


def test_intra_op_threads_are_searched_with_the_workers_and_the_guess_leaves_them_cores():
    facts = dict(CPU_LOADER, cpu_count=4, threads={"intra_op_threads": 4})
    space = build_space(facts, {"io": 0.8, "compute": 0.2}, "io-bound")
    knob = next(k for k in space.knobs if k.name == "intra_op_threads")
    # on a CPU they run the math too: they serve compute as well as io
    assert knob.group == "input" and knob.serves == ("io", "compute") and knob.baseline == 4
    assert list(knob.distribution.choices) == [1, 2, 4]
    guess = rule_based_guess(space, facts, fractions={"io": 0.8})
    assert guess["num_workers"] >= 4 and guess["intra_op_threads"] == 1
    assert space.to_config(space.baseline_params).changes() == {}  # the script's own threads: no change
    # The threads never take the workers' cores: 16 cores, 2 ranks, 2 workers leave 6; the choices
    # are 1, 4, 8 (and the script's 4): 4, not the nearer 8.
    wide = dict(facts, cpu_count=16, world_size=2, local_world_size=2)
    wide_space = build_space(wide, {"io": 0.5, "comm": 0.1, "launch": 0.1}, "io-bound")
    wide_guess = rule_based_guess(wide_space, wide, fractions={"io": 0.5, "comm": 0.1, "launch": 0.1})
    assert wide_guess["num_workers"] == 2 and wide_guess["intra_op_threads"] == 4, wide_guess
    unknown = build_space(CPU_LOADER, {"io": 0.8, "compute": 0.2}, "io-bound")
    assert "did not report" in unknown.excluded["intra_op_threads"]


def test_an_unmodified_script_gets_bf16_autocast_only_and_is_told_why():
    space = build_space(CPU_LOADER, {"io": 0.2, "compute": 0.8}, "compute-bound")
    amp = next(k for k in space.knobs if k.name == "amp_level")
    assert list(amp.distribution.choices) == ["O0", "O1"] and amp.baseline == "O0"
    assert "loss scaling" in space.excluded["amp_dtype"] and "master weights" in space.excluded["amp_level=O2"]
    no_bf16 = dict(CPU_LOADER, cuda=True, bf16_supported=False)
    assert "no bf16" in build_space(no_bf16, {"compute": 1.0}, "compute-bound").excluded["amp_level"]


def test_the_guess_acts_on_every_bottleneck_the_classifier_would_name():
    # Loading (29%) and the all-reduce (28%) hold the step back at once: one trial attacks both.
    facts = dict(CPU_LOADER, world_size=2, local_world_size=2, ddp={"bucket_cap_mb": 25.0, "static_graph": False},
                 accelerate={"called": True, "optimizer": True, "loader": True})
    fractions = {"io": 0.29, "comm": 0.28, "launch": 0.03, "compute": 0.40}
    space = build_space(facts, fractions, "io-bound")
    guess = rule_based_guess(space, facts, fractions=fractions)
    assert guess["num_workers"] >= 2 and guess["bucket_cap_mb"] == 100.0
    assert guess["amp_level"] == "O0"  # compute is what is left, not a verdict here: precision waits
    assert guess["grad_accum_steps"] == 2  # fewer all-reduces: comm is named (28%)
    gpu = dict(facts, cuda=True, bf16_supported=True, cuda_capability=[8, 0])
    assert rule_based_guess(build_space(gpu, fractions, "io-bound"), gpu, fractions=fractions)["grad_compression"] == "none"
    assert rule_based_guess(build_space(gpu, fractions, "comm-bound"), gpu, fractions=fractions)["grad_compression"] == "bf16"
    # A value between numeric choices becomes the nearest one (log scale), as in a restricted space.
    space.knobs = [dataclasses.replace(k, distribution=optuna.distributions.CategoricalDistribution([1.0, 25.0, 200.0]))
                   if k.name == "bucket_cap_mb" else k for k in space.knobs]
    assert rule_based_guess(space, facts, fractions=fractions)["bucket_cap_mb"] == 200.0
    quiet = {"io": 0.5, "comm": 0.06, "launch": 0.05, "compute": 0.39}  # comm searched (>= 5%), not guessed (< 10%)
    quiet_space = build_space(facts, quiet, "io-bound")
    assert rule_based_guess(quiet_space, facts, fractions=quiet)["bucket_cap_mb"] == 25.0


def test_a_compute_bound_cpu_run_searches_its_intra_op_threads():
    # On a shared box 2 intra-op threads against 1 measured 4.35x slower on a tiny BERT step; the
    # threads were searched only for an io share of 5% or more.
    facts = dict(CPU_LOADER, cpu_count=4, threads={"intra_op_threads": 4})
    space = build_space(facts, {"io": 0.0, "compute": 1.0}, "compute-bound")
    assert "intra_op_threads" in names(space) and "num_workers" not in names(space)
    gpu = dict(facts, cuda=True, cuda_capability=[9, 0], bf16_supported=True)
    assert "intra_op_threads" not in names(build_space(gpu, {"io": 0.0, "compute": 1.0}, "compute-bound"))


def test_without_a_verdict_every_applicable_knob_is_searched_not_left_out_at_zero():
    facts = dict(CPU_LOADER, cpu_count=4, threads={"intra_op_threads": 4})
    space = build_space(facts, {}, "unknown")
    assert {"num_workers", "intra_op_threads"} <= set(names(space))
    assert not any("takes only 0%" in why for why in space.excluded.values()), space.excluded


# ---------------------------------------------------------------------------------------------
# The baseline's verdict in words (tuner/profiled.py verdict_text)

def test_the_baseline_verdict_says_why_there_is_none():
    from perfscope.tuner.trial import TrialOutcome
    from perfscope.tuner.profiled import verdict_text

    ended = TrialOutcome(status="ok", losses=[1.0] * 30)
    text = verdict_text(None, None, ended)
    assert "the script ended before its profiled steps" in text and "-- --steps 60" in text
    assert "every applicable knob is searched" in text
    traced = TrialOutcome(status="ok", trace_files=[Path("rank0.json")])
    assert "could not be read" in verdict_text(None, None, traced)
    busy = {"overall": {"verdict": "io-bound", "provisional": True, "core_wait_share": 0.42}}
    assert verdict_text("io-bound", busy, traced) == "io-bound, provisional (busy host: 42% of the profiled steps waiting for a core)"
    none = {"overall": {"verdict": None, "reason": "every step is incomplete"}}
    assert verdict_text(None, none, traced).startswith("none (every step is incomplete;")


def test_a_loader_whose_workers_take_every_core_is_guessed_down_to_the_cores_and_searched_both_ways():
    facts = dict(CPU_LOADER, cpu_count=2, dataloader=dict(CPU_LOADER["dataloader"], num_workers=8),
                 threads={"intra_op_threads": 2})
    space = build_space(facts, {"io": 0.9, "compute": 0.1}, "io-bound")
    workers = space.distributions["num_workers"]
    assert workers.low == 0 and workers.high >= 8 and space.baseline_params["num_workers"] == 8
    guess = rule_based_guess(space, facts, fractions={"io": 0.9, "compute": 0.1})
    assert guess["num_workers"] == 2 and guess["intra_op_threads"] == 1
