"""The measurement runner's warm-up (``--drain-prefetch``): how many batches the loader's workers
hold ready, a warm-up that lasts until the setup's prefetched batches are used up (and no longer
without workers or when the model is the bottleneck), and the profiled steps after it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from measurekit import (
    LOOP,
    ROOT,
    no_config_from_env,  # noqa: F401 (autouse fixture)
    result,
    run_cli,
    step_lines,
    write_config,
)

from perfscope.measure import runner as measure

# --------------------------------------------------------------------------- warm-up until the prefetch is drained
PREFETCH = ROOT / "tests" / "scripts" / "measure_prefetch.py"
WORKERS, BATCH, SAMPLE_MS = 4, 8, 10.0
# The workers sleep SAMPLE_MS per sample: together they cannot deliver more than this, however fast
# the model is (a bound from the script's own settings, not a timing of this machine).
PRODUCER_BOUND = WORKERS * 1000.0 / SAMPLE_MS  # samples/s
SLOW_SETUP = ["--setup-s", 1.5, "--sample-ms", SAMPLE_MS, "--batch-size", BATCH, "--steps", 400]


def window_throughput(lines: list[dict]) -> float:
    measured = [rec for rec in lines if rec["measured"]]
    return sum(rec["samples"] for rec in measured) / sum(rec["seconds"] for rec in measured)


def check_window(lines: list[dict], res: dict, measure_steps: int, profile_steps: int = 0) -> int:
    """The warm-up, measured and profiled steps follow each other and the script stopped right after;
    returns the warm-up steps used."""
    used = res["warmup_steps_used"]
    after = profile_steps + 1 if profile_steps else 0  # the profiler's warm-up step, then P
    kinds = ["warmup"] * used + ["measured"] * measure_steps + ["profiled"] * after
    assert [rec["step"] for rec in lines] == list(range(1, len(kinds) + 1))
    assert [rec.get("warmup", False) for rec in lines] == [k == "warmup" for k in kinds]
    assert [rec["measured"] for rec in lines] == [k == "measured" for k in kinds]
    assert [rec.get("profiled", False) for rec in lines] == [k == "profiled" for k in kinds]
    assert res["exit_code"] == 0 and res["stopped_early"] and res["steps_seen"] == len(kinds)
    return used


def test_ready_batches_counts_what_the_workers_have_loaded():
    from perfscope.measure.warmup import ready_batches

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(40.0)), batch_size=2,
                                         num_workers=2, prefetch_factor=3)
    assert ready_batches(iter(torch.utils.data.DataLoader(list(range(4))))) == (None, 0)
    it = iter(loader)
    try:
        seen = _poll(lambda: ready_batches(it), lambda r: r == (6, 2))
        assert seen == (6, 2)  # 2 workers x prefetch_factor 3, all loaded while nobody fetched
        next(it)
        assert ready_batches(it)[0] in (5, 6)  # one taken, one more asked for
        assert _poll(lambda: ready_batches(it), lambda r: r == (6, 2)) == (6, 2)
    finally:
        it._shutdown_workers()


def _poll(read, done, limit_s: float = 60.0):
    import time

    deadline = time.monotonic() + limit_s  # a generous wait for the workers, not a speed check
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.02)
        value = read()
    return value


@pytest.mark.slow
def test_drain_prefetch_measures_the_producers_not_the_setups_buffer(tmp_path):
    config = write_config(tmp_path, f"num_workers: {WORKERS}\nprefetch_factor: 8\n")
    runs = {}
    for drain in (False, True):
        out = tmp_path / f"rec-{drain}"
        options = ["--warmup-steps", "2", "--measure-steps", "32", "--config", str(config)]
        proc = run_cli(out, *options, *(["--drain-prefetch"] if drain else []), script=PREFETCH, args=SLOW_SETUP)
        assert proc.returncode == 0, proc.stderr
        lines, res = step_lines(out), result(out)
        used = check_window(lines, res, 32)
        first = next(rec for rec in lines if rec["measured"])
        runs[drain] = used, first["ready"], window_throughput(lines)
        assert res["facts"]["dataloader"]["num_workers"] == WORKERS
    # The setup left the workers' 32-batch buffer full: drained in an extended warm-up, so the
    # measured steps find at most a round of batches ready and run at the workers' pace ...
    used, ready, throughput = runs[True]
    assert used > 2 and ready is not None and ready <= WORKERS
    assert throughput <= PRODUCER_BOUND * 1.15
    # ... where a fixed warm-up measures batches loaded for free during the setup.
    used, ready, throughput = runs[False]
    assert used == 2 and ready > WORKERS
    assert throughput > PRODUCER_BOUND * 1.15


def test_without_workers_the_warmup_is_exactly_w(tmp_path):
    out = tmp_path / "rec"
    res = measure.measure_in_process(LOOP, ["--steps", "20"], record_dir=out, warmup_steps=2, measure_steps=3,
                                     drain_prefetch=True)

    lines = step_lines(out)
    assert check_window(lines, res, 3) == 2
    assert all(rec["ready"] is None for rec in lines)


def test_a_consumer_bound_run_ends_its_warmup_soon(tmp_path):
    # Workers that load instantly and a model that takes its time: the buffer stays full.
    args = ["--sample-ms", 0, "--batch-size", 32, "--width", 512, "--layers", 4, "--num-workers", 2,
            "--prefetch-factor", 2, "--steps", 200]
    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "2", "--measure-steps", "4", "--drain-prefetch", script=PREFETCH,
                   args=args)
    assert proc.returncode == 0, proc.stderr

    lines, res = step_lines(out), result(out)
    used = check_window(lines, res, 4)
    assert 2 <= used <= 2 + 16  # the cap is 64 more
    assert all(isinstance(rec["ready"], int) for rec in lines[1:])


@pytest.mark.slow
def test_profiled_steps_follow_an_extended_warmup(tmp_path):
    from perfscope.analysis.run import analyze_files

    config = write_config(tmp_path, f"num_workers: {WORKERS}\nprefetch_factor: 8\n")
    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "2", "--measure-steps", "4", "--profile-steps", "2", "--config",
                   str(config), "--drain-prefetch", script=PREFETCH, args=SLOW_SETUP)
    assert proc.returncode == 0, proc.stderr

    res = result(out)
    used = check_window(step_lines(out), res, 4, profile_steps=2)
    assert used > 2
    trace = out / "traces" / "rank0.pt.trace.json.gz"
    assert res["trace"] == str(trace) and trace.is_file()
    # After the measured steps, the profiler's warm-up step, then the two recorded ones.
    assert sorted(analyze_files([trace]).steps["step"]) == [used + 6, used + 7]


def test_only_one_process_trials_drain_the_prefetch(tmp_path):
    from perfscope.tuner.trial import TrialSpec, measure_command

    one = measure_command(TrialSpec(script="train.py", script_args=("--x",)), tmp_path, None, 0)
    ranks = measure_command(TrialSpec(script="train.py", script_args=("--x",), nproc_per_node=2), tmp_path, None, 0)
    assert "--drain-prefetch" in one[: one.index("--")]
    assert "--drain-prefetch" not in ranks
    options, script, args = measure.parse_argv(one[one.index("-m") + 2:])
    assert options["drain_prefetch"] and script == "train.py" and args == ["--x"]
    assert not measure.parse_argv(ranks[ranks.index("perfscope.measure") + 1:])[0]["drain_prefetch"]
