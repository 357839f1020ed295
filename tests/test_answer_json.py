"""`--json`: the answer a program reads (perfscope.record.answer) -- one JSON document on stdout,
valid against the schema generated from its structs, on the verdict's clock, abstentions as null
with a reason (never 0)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest
from test_one_clock import _run
from tracegen import cpu_op, dataloader, runtime, step, write_trace
from tracekit import analyze

from perfscope import steptime
from perfscope.runtime.config import KEYS
from perfscope.record import answer
from perfscope.record.job_facts import LoaderRecord
from perfscope.record.schema import Facts
from perfscope.record.answer import Answer, answer_of

ROOT = Path(__file__).resolve().parents[1]


def _decode(text: str) -> Answer:
    return msgspec.json.decode(text, type=Answer)  # the structs the schema is generated from, checked


def test_the_schema_file_is_generated_from_the_structs():
    assert json.loads((ROOT / "docs" / "answer.schema.json").read_text()) == answer.schema(), \
        "docs/answer.schema.json is stale: python -m perfscope.record.answer > docs/answer.schema.json"


@pytest.mark.parametrize("contended", [0.0, 0.6], ids=["quiet", "contended"])
def test_the_answer_is_on_the_verdicts_clock_with_each_what_if_its_share(tmp_path, contended):
    summary = _run(tmp_path, np.random.default_rng(3), contended).summary()
    got = _decode(answer.encode(answer_of(summary)))
    overall = summary["overall"]
    assert got.verdict == overall["verdict"] and got.provisional is bool(overall["provisional"])
    assert got.basis == (answer.WAITFREE if contended else answer.MEASURED)
    rows = steptime.verdict_rows(summary["steps"], overall["provisional"])
    assert got.step_time_us == pytest.approx(steptime.step_time_us(rows))
    if contended:
        assert got.measured_step_time_us > got.step_time_us  # the waits taken out of the basis only
    assert got.advice, "an io share gets its advice item"
    for item in got.advice:
        assert item.share == pytest.approx(got.shares[item.class_])
        assert item.what_if.saved_us_per_step == pytest.approx(item.share * got.step_time_us, rel=1e-9)
        assert item.change and f"{item.share:.0%}" in item.evidence
        assert item.knobs and set(item.knobs) <= set(KEYS)  # keys a --config file or the tuner sets
    assert got.verdict_knobs == summary["details"]["knobs"][got.verdict.removesuffix("-bound")]
    assert got.mfu is None and got.mfu_why  # a hand-made trace has no FLOPs: null with its reason


def test_no_verdict_is_null_with_its_reason_and_no_advice(tmp_path):
    # a CUDA run whose kernels the profiler lost: launches and no GPU activity
    events = [step(1, 0, 100_000), *(runtime("cudaLaunchKernel", 10 + 50 * i, 5, correlation=i + 1) for i in range(50))]
    got = answer_of(analyze(tmp_path, events).summary())
    assert got.verdict is None and "no GPU activity recorded" in got.reason
    assert got.shares is None and got.advice == [] and got.runner_up is None
    assert got.step_time_us is None  # no counted step: null, never 0


def test_analyze_json_prints_one_document_and_nothing_else_on_stdout(tmp_path):
    events = []
    for n in range(6):
        t = 2000 * n
        events += [step(n + 1, t, 1900), dataloader(t, 900), cpu_op("aten::mm", t + 950, 900)]
    trace = write_trace(tmp_path / "io.json", events)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "perfscope", "analyze", str(trace), "--out", str(out), "--json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    got = _decode(done.stdout)  # the whole of stdout is the one document
    assert done.stdout.count("\n") == 1
    assert got.verdict == "io-bound" and got.advice[0].class_ == "io"
    assert Path(got.summary_path).is_file() and Path(got.report_path).is_file()
    assert got.summary_path == str(out.resolve() / "summary.json") or Path(got.summary_path).samefile(out / "summary.json")


@pytest.mark.slow
def test_profile_json_keeps_the_scripts_prints_off_stdout(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "perfscope", "profile", str(ROOT / "examples" / "io_bound.py"), "--out",
                           str(out), "--max-steps", "0", "--json", "--", "--steps", "20"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    got = _decode(done.stdout)
    assert "steps in" in done.stderr  # the script's own last line, moved to stderr
    assert got.verdict is None or got.verdict.endswith("-bound")  # a busy machine may withhold it, with a reason
    assert got.verdict or got.reason
    assert Path(got.summary_path).is_file()


@pytest.mark.parametrize("cls, mode, facts, first, absent", [
    ("comm", "gpu", {}, "bucket_cap_mb", None),
    ("comm", "gpu", {"fsdp": 2}, "reshard_after_forward", "bucket_cap_mb"),
    ("comm", "gpu", {"job": {"nnodes": 2}}, "hierarchical_allreduce", None),
    ("launch", "gpu", {"cuda_graphs": True}, "batch_size", "compile"),
    ("compute", "cpu", {"convolutions": False}, "amp_level", "channels_last"),
    ("launch", "cpu", {"optimizer_step": {"implementation": "for-loop", "share": 0.3, "operators_per_step": 126,
                                          "classes": ["AdamW"], "step_time_us": 1e4, "step_time_without_us": 7e3,
                                          "speedup": 1.4}}, "optimizer_impl", None),
])
def test_the_advice_keys_follow_what_the_trace_showed(cls, mode, facts, first, absent):
    from perfscope.analysis.verdict import knobs_for

    keys = knobs_for(cls, mode, msgspec.convert(facts, Facts))
    assert keys[0] == first and absent not in keys


def test_fsdp1_and_a_loader_at_its_cores_name_no_key():
    from perfscope.analysis.verdict import knobs_for

    assert knobs_for("comm", "gpu", Facts(fsdp=1)) == ()
    assert knobs_for("io", "cpu", Facts(loader=LoaderRecord(num_workers=8, cores=8))) == ()
    assert knobs_for("io", "cpu", Facts(loader=LoaderRecord(num_workers=2, cores=8)))[0] == "num_workers"
