"""Cost per step (`--price-per-hour`): the step time x price / 3600 per device (a GPU per rank on GPU
runs, a machine per node on CPU runs), per 1,000 samples where the batch is known, per run where the
whole-run record is, the removable and idle shares priced; in summary.json, the console, the
report and the answer; null with a reason where unknown (docs/metrics.md, Cost)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from perfscope.analysis.cost import cost_view
from perfscope.console_views import usd

ROOT = Path(__file__).resolve().parents[1]
EVAL_TRACES = ROOT / "evals" / "traces"


def test_a_gpu_step_costs_its_time_at_the_price_of_every_device():
    c = cost_view(price_per_hour=3.6, step_time_us=100_000.0, shares={"io": 0.25, "launch": 0.1, "other": 0.05,
                  "comm": 0.0, "compute": 0.6}, mode="gpu", world_size=8, nnodes=2, batch_size=32, run_seconds=7200.0)
    assert c.per_step == pytest.approx(0.1 / 3600 * 3.6 * 8)  # 8 GPUs, not 2 machines
    assert c.per_1000_samples == pytest.approx(c.per_step * 1000 / (32 * 8))
    assert c.per_run == pytest.approx(2 * 3.6 * 8)
    assert c.shares == pytest.approx({"io": 0.25 * c.per_step, "comm": 0.0, "launch": 0.1 * c.per_step,
                                  "other": 0.05 * c.per_step})
    assert (c.unit, c.devices) == ("GPU", 8)


def test_a_cpu_run_is_priced_per_machine_and_unknowns_are_null_with_their_reason():
    c = cost_view(price_per_hour=1.0, step_time_us=3600.0, shares=None, mode="cpu", world_size=4, nnodes=2,
                  batch_size=None, run_seconds=None)
    assert (c.unit, c.devices) == ("machine", 2) and c.per_step == pytest.approx(2e-6)
    assert c.per_1000_samples is None and "batch size" in c.per_1000_samples_why
    assert c.per_run is None and "whole-run record" in c.per_run_why
    none = cost_view(price_per_hour=1.0, step_time_us=None, shares=None, mode="gpu", world_size=1, nnodes=1,
                     batch_size=8, run_seconds=None)
    assert none.per_step is None and none.per_step_why == "no step was counted"  # never 0
    assert cost_view(price_per_hour=None, step_time_us=1.0, shares=None, mode="gpu", world_size=1, nnodes=1,
                     batch_size=None, run_seconds=None) is None


def test_usd_never_shows_an_exponent():
    assert usd(0.0000203) == "$0.0000203" and usd(1.5) == "$1.50" and usd(12345.0) == "$12,345"


def _analyze(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "perfscope", "analyze", str(EVAL_TRACES / "gpu-io.json.gz"),
                           "--out", str(tmp_path / "out"), *args], capture_output=True, text=True, timeout=300)


def test_analyze_with_a_price_puts_the_cost_everywhere_a_user_reads(tmp_path):
    done = _analyze(tmp_path, "--price-per-hour", "2.5")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    cost = summary["details"]["cost"]
    assert summary["run"]["price_per_hour"] == 2.5
    assert cost["per_step"] == pytest.approx(summary["overall"]["step_time_us"] / 1e6 * 2.5 / 3600)
    line = next(x for x in done.stdout.splitlines() if x.startswith("cost: "))
    assert f"{usd(cost['per_step'])} a step (1 GPU at $2.50/h)" in line and f"io {usd(cost['shares']['io'])}" in line
    html = (tmp_path / "out" / "report.html").read_text()
    assert '<p class="cost"><strong>Cost</strong>: ' + usd(cost["per_step"]) in html
    answer = json.loads(_analyze(tmp_path, "--price-per-hour", "2.5", "--json").stdout)
    assert answer["cost"]["per_step"] == pytest.approx(cost["per_step"]) and answer["cost_why"] is None


def test_without_a_price_there_is_no_cost_and_the_answer_says_why(tmp_path):
    answer = json.loads(_analyze(tmp_path, "--json").stdout)
    assert answer["cost"] is None and "--price-per-hour" in answer["cost_why"]


@pytest.mark.parametrize("price", ["-1", "nan", "abc"])
def test_a_bad_price_is_one_line(tmp_path, price):
    done = _analyze(tmp_path, "--price-per-hour", price)
    assert done.returncode == 2 and "--price-per-hour" in done.stderr and "Traceback" not in done.stderr
