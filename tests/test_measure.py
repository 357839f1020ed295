"""The measurement runner of ``perfscope tune`` (``perfscope.collect.measure``): step lines, samples,
losses, facts, the profiled window, failures, several ranks, and cleaning up after itself."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import numpy as np
import torch.utils.data.dataloader as dataloader_mod
from torch.nn.parallel import DistributedDataParallel

from perfscope.collect import control, measure, measure_hooks
from perfscope.collect.measure_hooks import batch_size

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
LOOP = ROOT / "tests" / "scripts" / "measure_loop.py"


@pytest.fixture(autouse=True)
def _no_config_from_env(monkeypatch):
    monkeypatch.delenv("PERFSCOPE_CONFIG", raising=False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield
    from perfscope.runtime import accelerator

    accelerator._active = None


def run_cli(record_dir: Path, *options: str, script: Path, args=(), launcher=()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PERFSCOPE_CONFIG", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, *launcher, "-m", "perfscope.collect.measure", "--record-dir", str(record_dir),
               *options, "--", str(script), *map(str, args)]
    return subprocess.run(command, check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)


def step_lines(record_dir: Path, rank: int = 0) -> list[dict]:
    return [json.loads(line) for line in (record_dir / f"rank{rank}.steps.jsonl").read_text().splitlines()]


def result(record_dir: Path, rank: int = 0) -> dict:
    return json.loads((record_dir / f"rank{rank}.json").read_text())


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- the contract, end to end
def test_io_bound_steps_samples_and_losses(tmp_path):
    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "2", "--measure-steps", "4", script=EXAMPLES / "io_bound.py",
                   args=["--steps", 20, "--decode-ms", 1])
    assert proc.returncode == 0, proc.stderr

    lines = step_lines(out)
    assert [rec["step"] for rec in lines] == [1, 2, 3, 4, 5, 6]
    assert [rec["measured"] for rec in lines] == [False, False, True, True, True, True]
    assert all(rec["samples"] == 16 for rec in lines)
    assert all(rec["data_wait_s"] > 0 and rec["seconds"] > 0 for rec in lines)
    assert all(rec["data_wait_s"] <= rec["seconds"] for rec in lines)
    assert not any("profiled" in rec for rec in lines)
    res = result(out)
    assert res["exit_code"] == 0 and res["error"] is None and res["error_kind"] is None
    assert res["stopped_early"] and res["steps_seen"] == 6
    assert len(res["losses"]) == 6 and all(math.isfinite(v) for v in res["losses"])
    assert res["loss_source"] == "autograd.backward"
    assert res["trace"] is None and res["config_applied"] is None
    facts = res["facts"]
    assert facts["dataloader"] == {"num_workers": 0, "pin_memory": False, "prefetch_factor": None,
                                   "persistent_workers": False, "iterable": False, "batch_size": 16}
    assert facts["world_size"] == 1 and facts["ddp"] is None and facts["dist_backend"] is None
    assert facts["accelerate"] == {"called": False, "optimizer": False, "loader": False}
    assert facts["torch"] == torch.__version__ and facts["cuda"] == torch.cuda.is_available()
    assert facts["cpu_count"] >= 1 and isinstance(facts["tf32"], bool)


@pytest.mark.slow
def test_profiled_window_after_the_measured_steps(tmp_path):
    from perfscope.analysis.run import analyze_files

    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "2", "--measure-steps", "4", "--profile-steps", "2",
                   script=EXAMPLES / "io_bound.py", args=["--steps", 20, "--decode-ms", 1])
    assert proc.returncode == 0, proc.stderr

    lines = step_lines(out)
    assert [rec["step"] for rec in lines] == list(range(1, 10))  # W+K, the profiler's warm-up, P
    assert [rec["measured"] for rec in lines] == [False] * 2 + [True] * 4 + [False] * 3
    assert [rec.get("profiled", False) for rec in lines] == [False] * 6 + [True] * 3
    res = result(out)
    trace = out / "traces" / "rank0.pt.trace.json.gz"
    assert res["trace"] == str(trace) and trace.is_file()
    assert res["steps_seen"] == 9 and res["stopped_early"] and len(res["losses"]) == 9
    steps = analyze_files([trace]).steps
    assert sorted(steps["step"]) == [8, 9]  # ProfilerStep#N is training step N


def test_config_is_applied_and_recorded(tmp_path):
    config = write_config(tmp_path, "num_workers: 2\n")
    out = tmp_path / "rec"
    res = measure.measure_in_process(EXAMPLES / "io_bound.py", ["--steps", "20", "--decode-ms", "1"],
                                     record_dir=out, warmup_steps=1, measure_steps=2, config=config)

    assert res["exit_code"] == 0
    assert res["facts"]["dataloader"]["num_workers"] == 2
    assert res["facts"]["dataloader"]["prefetch_factor"] == 2
    assert res["config_applied"]["applied"].keys() == {"num_workers"}
    assert res["config_applied"]["loaders"] == 1
    assert result(out) == res
    assert "PERFSCOPE_CONFIG" not in os.environ


def test_accelerated_script_reports_its_undivided_loss(tmp_path):
    args = ["--steps", "16", "--decode-ms", "0"]
    plain = measure.measure_in_process(EXAMPLES / "accelerated.py", args, record_dir=tmp_path / "plain",
                                       warmup_steps=1, measure_steps=3)
    config = write_config(tmp_path, "grad_accum_steps: 2\n")
    accum = measure.measure_in_process(EXAMPLES / "accelerated.py", args, record_dir=tmp_path / "accum",
                                       warmup_steps=1, measure_steps=3, config=config)

    for res in (plain, accum):
        assert res["exit_code"] == 0 and res["loss_source"] == "perfscope.backward"
        assert res["facts"]["accelerate"] == {"called": True, "optimizer": True, "loader": True}
    assert {rec["samples"] for rec in step_lines(tmp_path / "plain")} == {16}
    assert {rec["samples"] for rec in step_lines(tmp_path / "accum")} == {32}  # two micro-batches a step
    # Not divided by the 2 micro-steps (a cross-entropy over 10 classes starts near ln 10 = 2.3).
    ratio = np.mean(accum["losses"]) / np.mean(plain["losses"])
    assert 0.7 < ratio < 1.4
    assert accum["config_applied"]["by_accelerate"].keys() == {"grad_accum_steps"}


@pytest.mark.parametrize("backward", ["plain", "perfscope", "accelerate"])
def test_losses_are_the_step_means_of_what_the_script_computed(tmp_path, monkeypatch, backward):
    log = tmp_path / "losses.txt"
    config = write_config(tmp_path, "grad_accum_steps: 2\n") if backward == "accelerate" else None
    plain_captures = []
    original = measure_hooks.Recorder.note_autograd_loss
    monkeypatch.setattr(measure_hooks.Recorder, "note_autograd_loss",
                        lambda self, loss: plain_captures.append(loss) or original(self, loss))
    res = measure.measure_in_process(LOOP, ["--steps", "40", "--backward", backward, "--loss-log", str(log)],
                                     record_dir=tmp_path / "rec", warmup_steps=1, measure_steps=3, config=config)

    seen = [float(line) for line in log.read_text().split()]
    per_step = 2 if backward == "accelerate" else 1
    expected = [sum(seen[i:i + per_step]) / per_step for i in range(0, 4 * per_step, per_step)]
    assert res["losses"] == pytest.approx(expected, rel=1e-6)
    assert res["loss_source"] == ("autograd.backward" if backward == "plain" else "perfscope.backward")
    # perfscope.backward's own loss.backward() is not seen a second time as a plain backward.
    assert bool(plain_captures) == (backward == "plain")


def test_seeds_are_set_before_the_script(tmp_path):
    log = tmp_path / "seeds.json"
    measure.measure_in_process(LOOP, ["--steps", "8", "--seed-log", str(log)], record_dir=tmp_path / "rec",
                               warmup_steps=0, measure_steps=2, seed=7)
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    assert json.loads(log.read_text()) == [random.random(), float(np.random.rand()), torch.rand(1).item()]


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
    from perfscope.collect.measure_warmup import ready_batches

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
    from tuner.trial import TrialSpec, measure_command

    one = measure_command(TrialSpec(script="train.py", script_args=("--x",)), tmp_path, None, 0)
    ranks = measure_command(TrialSpec(script="train.py", script_args=("--x",), nproc_per_node=2), tmp_path, None, 0)
    assert "--drain-prefetch" in one[: one.index("--")]
    assert "--drain-prefetch" not in ranks
    options, script, args = measure.parse_argv(one[one.index("-m") + 2:])
    assert options["drain_prefetch"] and script == "train.py" and args == ["--x"]
    assert not measure.parse_argv(ranks[ranks.index("perfscope.collect.measure") + 1:])[0]["drain_prefetch"]


# --------------------------------------------------------------------------- failures and short runs
@pytest.mark.parametrize(("error", "kind"), [("memory", "oom"), ("cpu-alloc", "oom"), ("value", "error")])
def test_a_failing_script_still_leaves_its_record(tmp_path, error, kind):
    out = tmp_path / "rec"
    res = measure.measure_in_process(LOOP, ["--steps", "20", "--fail-at", "3", "--error", error],
                                     record_dir=out, warmup_steps=2, measure_steps=4)

    assert res["exit_code"] == 1 and res["error_kind"] == kind
    assert "\n" not in res["error"] and "measure_loop.py raised" in res["error"]
    assert res["steps_seen"] == 2 and not res["stopped_early"]
    assert len(res["losses"]) == 2
    assert [rec["step"] for rec in step_lines(out)] == [1, 2]
    assert result(out) == res


def test_a_script_that_ends_early_exits_cleanly(tmp_path):
    out = tmp_path / "rec"
    res = measure.measure_in_process(LOOP, ["--steps", "3"], record_dir=out, warmup_steps=2, measure_steps=4)

    assert res["exit_code"] == 0 and res["error"] is None and res["error_kind"] is None
    assert res["steps_seen"] == 3 and not res["stopped_early"]
    assert len(res["losses"]) == 3
    # Step 3 ended at the loader's last fetch (the one that raised StopIteration).
    assert [rec["step"] for rec in step_lines(out)] == [1, 2, 3]
    assert [rec["measured"] for rec in step_lines(out)] == [False, False, True]


def test_patches_are_removed_even_after_a_failure(tmp_path):
    before = (dataloader_mod._BaseDataLoaderIter.__dict__["__next__"],
              dataloader_mod._BaseDataLoaderIter.__dict__["__init__"],
              DistributedDataParallel.__dict__["__init__"], torch.autograd.backward)
    config = write_config(tmp_path, "num_workers: 0\nbucket_cap_mb: 10\n")
    measure.measure_in_process(LOOP, ["--fail-at", "2"], record_dir=tmp_path / "a", warmup_steps=1,
                               measure_steps=1, config=config)
    measure.measure_in_process(LOOP, [], record_dir=tmp_path / "b", warmup_steps=1, measure_steps=1)

    after = (dataloader_mod._BaseDataLoaderIter.__dict__["__next__"],
             dataloader_mod._BaseDataLoaderIter.__dict__["__init__"],
             DistributedDataParallel.__dict__["__init__"], torch.autograd.backward)
    assert after == before
    assert control.observer is None and control.active is None


# --------------------------------------------------------------------------- DDP
DDP_ACCELERATED = """
import torch, torch.distributed as dist
import perfscope
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt, _ = perfscope.accelerate(model, opt, config={CONFIG!r})
for _ in range(20):
    opt.zero_grad()
    perfscope.backward(model(torch.randn(4, 8)).square().mean())
    opt.step()
dist.destroy_process_group()
"""


def test_ddp_built_by_the_script_under_a_config(tmp_path):
    config = write_config(tmp_path, "bucket_cap_mb: 50\n")
    res = measure.measure_in_process(EXAMPLES / "comm_bound.py", ["--steps", "10", "--width", "64"],
                                     record_dir=tmp_path / "rec", warmup_steps=1, measure_steps=2, config=config)

    assert res["exit_code"] == 0
    assert res["facts"]["ddp"] == {"bucket_cap_mb": 50.0, "static_graph": False}
    assert res["facts"]["dist_backend"] == "gloo" and res["facts"]["world_size"] == 1
    assert res["config_applied"]["ddp_modules"] == 1  # the launch patch still sees the script's call
    assert all(rec["samples"] is None for rec in step_lines(tmp_path / "rec"))


def test_ddp_built_by_accelerate_is_not_patched_again(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(DDP_ACCELERATED.replace("{CONFIG!r}", repr({"bucket_cap_mb": 40.0, "static_graph": True})))
    config = write_config(tmp_path, "bucket_cap_mb: 10\n")
    res = measure.measure_in_process(script, [], record_dir=tmp_path / "rec", warmup_steps=1, measure_steps=2,
                                     config=config)

    assert res["exit_code"] == 0, res["error"]
    # The measurement's own DDP wrapper must not hide accelerate's call from the launch patch.
    assert res["config_applied"]["ddp_modules"] == 0
    assert res["facts"]["ddp"] == {"bucket_cap_mb": 40.0, "static_graph": True}
    assert res["loss_source"] == "perfscope.backward"


@pytest.mark.slow
def test_two_ranks_under_torchrun(tmp_path):
    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "1", "--measure-steps", "2", script=EXAMPLES / "comm_bound.py",
                   args=["--steps", 12], launcher=["-m", "torch.distributed.run", "--standalone",
                                                   "--nproc-per-node", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]

    for rank in (0, 1):
        lines = step_lines(out, rank)
        assert [rec["measured"] for rec in lines] == [False, True, True]
        assert all(rec["samples"] is None and rec["data_wait_s"] == 0 for rec in lines)
        res = result(out, rank)
        assert res["exit_code"] == 0 and res["stopped_early"] and res["steps_seen"] == 3
        assert res["loss_source"] == "autograd.backward"
        facts = res["facts"]
        assert facts["world_size"] == 2 and facts["local_world_size"] == 2 and facts["dist_backend"] == "gloo"
        assert facts["ddp"] == {"bucket_cap_mb": 25.0, "static_graph": False}
        assert facts["dataloader"] is None


# --------------------------------------------------------------------------- processes and options
def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has ended; only its exit status is left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_dataloader_worker_outlives_the_measurement(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "1", "--measure-steps", "2", script=LOOP,
                   args=["--steps", 50, "--num-workers", 2, "--pid-dir", pids])
    assert proc.returncode == 0, proc.stderr

    workers = [int(p.name) for p in pids.iterdir()]
    assert len(workers) == 2
    assert [pid for pid in workers if _alive(pid)] == []
    assert result(out)["facts"]["dataloader"]["num_workers"] == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--warmup-steps", "1", "--measure-steps", "2", "--", "x.py"], "missing --record-dir"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "0", "--", "x.py"], "--measure-steps"),
        (["--record-dir", "R", "--warmup-steps", "-1", "--measure-steps", "2", "--", "x.py"], "--warmup-steps"),
        (["--record-dir", "R", "--warmup-steps", "a", "--measure-steps", "2", "--", "x.py"], "integer"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "2", "--bogus", "1", "--", "x.py"],
         "unknown option --bogus"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "2", "--"], "missing SCRIPT"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "2", "--seed"], "needs a value"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "2", "--drain-prefetch", "--drain-prefetch",
          "--", "x.py"], "given twice"),
        (["--record-dir", "R", "--warmup-steps", "1", "--measure-steps", "2", "--", "missing.py"],
         "script not found"),
    ],
)
def test_bad_options_exit_2_with_one_line(tmp_path, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert measure.main(argv) == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfscope.collect.measure: error:") and message in lines[0]


def test_bad_config_exits_2_and_says_why_in_the_record(tmp_path):
    config = write_config(tmp_path, "num_workers: -3\n")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = measure.main(["--record-dir", str(tmp_path / "rec"), "--warmup-steps", "1", "--measure-steps", "1",
                             "--config", str(config), "--", str(LOOP)])
    assert code == 2 and "num_workers" in err.getvalue()
    res = result(tmp_path / "rec")
    assert res["exit_code"] == 2 and "num_workers" in res["error"]


def test_python_api_rejects_bad_step_counts(tmp_path):
    with pytest.raises(ValueError, match="measure_steps"):
        measure.measure_in_process(LOOP, [], record_dir=tmp_path, warmup_steps=0, measure_steps=0)
    with pytest.raises(ValueError, match="profile_steps"):
        measure.measure_in_process(LOOP, [], record_dir=tmp_path, warmup_steps=0, measure_steps=1, profile_steps=-1)


# --------------------------------------------------------------------------- batch size
def test_batch_size_is_the_leading_dimension_of_the_first_tensor():
    pair = collections.namedtuple("Pair", "x y")
    t = torch.zeros(5, 3)
    assert batch_size(t) == 5
    assert batch_size((t, torch.zeros(2))) == 5
    assert batch_size([["text"] * 3, {"ids": torch.zeros(7, 2)}]) == 7
    assert batch_size({"meta": "a", "x": pair(torch.zeros(4), t)}) == 4
    assert batch_size((torch.tensor(1.0), t)) == 5  # a 0-d tensor has no batch dimension
    assert batch_size(["a", 3, None]) is None
    assert batch_size(object()) is None
