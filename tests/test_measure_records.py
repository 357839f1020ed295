"""The measurement runner of ``perfscope tune`` (``perfscope.measure``), what it records:
step lines, samples, losses, seeds, facts, the config applied and the profiled window, a script
that fails or ends early, patches removed afterwards, and how a batch's size is read."""

from __future__ import annotations

import collections
import json
import math
import os
import random

import pytest

torch = pytest.importorskip("torch")
import numpy as np
import torch.utils.data.dataloader as dataloader_mod
from measurekit import (
    EXAMPLES,
    LOOP,
    no_config_from_env,  # noqa: F401 (autouse fixture)
    result,
    run_cli,
    step_lines,
    write_config,
)
from torch.nn.parallel import DistributedDataParallel

from perfscope import control
from perfscope.measure import hooks as measure_hooks
from perfscope.measure import runner as measure
from perfscope.measure.hooks import batch_size


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
    assert not any(rec["profiled"] for rec in lines)
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
        assert res["facts"]["accelerate"] == {"called": True, "optimizer": True, "loader": True,
                                                 "optimizer_class": "SGD"}
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


# --------------------------------------------------------------------------- the rank record
def test_the_rank_record_is_read_once_validated_and_keeps_nan_losses(tmp_path):
    from perfscope.measure.protocol import RankResult, read_rank_result, result_path, write_rank_result

    write_rank_result(tmp_path, 0, RankResult(exit_code=0, steps_seen=12, losses=[1.5, float("nan"), None]))
    got = read_rank_result(tmp_path, 0)
    assert got.steps_seen == 12 and got.losses[0] == 1.5 and got.losses[1] != got.losses[1] and got.losses[2] is None
    assert "NaN" in result_path(tmp_path, 0).read_text()  # a diverged loss is kept, not turned into null
    assert read_rank_result(tmp_path, 1) is None  # the rank died before it wrote one
    for bad in ("{", "[]", '{"exit_code": "zero"}', '{"exit_code": 0, "error_kind": "segfault"}', "\udcff"):
        result_path(tmp_path, 2).write_text(bad, errors="surrogateescape")
        assert read_rank_result(tmp_path, 2) is None, bad


def test_step_lines_have_one_writer_and_one_reader_that_drops_torn_and_bad_lines(tmp_path):
    from perfscope.measure.protocol import StepLine, encode_step_line, read_step_lines, steps_path
    from perfscope.measure.records import StepReader, drawn_from_queues

    path = steps_path(tmp_path, 3)
    assert path.name == "rank3.steps.jsonl"
    lines = [StepLine(step=1, seconds=0.5, warmup=True, ready=4),
             StepLine(step=2, seconds=0.25, samples=8, data_wait_s=0.1, measured=True, ready=4),
             StepLine(step=3, seconds=0.25, samples=8, measured=True, ready=3),
             StepLine(step=4, seconds=0.3, profiled=True, ready=1)]
    bad = [b'{"step": 0, "seconds": 1}\n', b'{"step": 5, "seconds": -1}\n', b'{"step": "6"}\n', b"[]\n", b"{\n"]
    path.write_bytes(b"".join(encode_step_line(x) for x in lines[:2]) + b"".join(bad)
                     + b"".join(encode_step_line(x) for x in lines[2:]))
    assert read_step_lines(path) == lines  # every malformed line dropped, the rest in order
    assert json.loads(encode_step_line(lines[1]))["samples"] == 8  # plain JSON for anyone reading it
    # 2 batches of 8 were ready at the window's first step and drained by the step after it
    assert drawn_from_queues(path, 8, 2) == 3 * 8 and drawn_from_queues(path, None, 2) == 0
    assert read_step_lines(tmp_path / "missing.jsonl") == []

    torn = tmp_path / "torn.jsonl"
    whole = encode_step_line(lines[1])
    torn.write_bytes(whole[:10])
    reader = StepReader(torn)
    reader.poll()
    assert reader.measured == []  # half a line waits for its end
    torn.write_bytes(whole + encode_step_line(lines[0]))
    reader.poll()
    assert reader.measured == [lines[1]]  # the warm-up step is not a measured one
