"""Profile and tune ResNet-50 and Swin-T with the launch- and compute-bound knobs, and say what they gained.

For each model of ``examples/vision_models.py`` (random init, synthetic images on the device):

1. ``perfscope profile``: the verdict, the step time and the MFU of the default configuration;
2. ``perfscope tune --run-steps N``: a search over every knob that applies (``compile``,
   ``channels_last``, ``optimizer_impl``, AMP, TF32, ``fused_ops`` for Swin ...), the winner proven
   against the default in interleaved rounds, its compile time weighed over an N-step run;
3. ``perfscope profile --config best.yaml``: the verdict and the MFU after.

It prints one table (model, verdict before/after, proven speed-up with its interval, the
configuration, compile seconds, MFU before/after) and writes it with every number to
``OUT/gpu-proof.json`` and ``OUT/gpu-proof.md``. On one H100 it is sized to end within 8 minutes
(``--budget``: the tuning's time per model). ``--reduced`` is the CPU mode CI runs: the same steps
on width-reduced models, small images and a two-trial tune, to prove the script works end to end.

Usage::

    python scripts/gpu_proof.py [--out DIR] [--budget 150]
    python scripts/gpu_proof.py --reduced --out DIR     # CPU, about two minutes
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/vision_models.py"
# The models' script arguments: full size on a GPU, reduced for a CPU run in CI.
FULL = {"resnet50": ["--model", "resnet50", "--batch-size", "64", "--steps", "120"],
        "swin_t": ["--model", "swin_t", "--batch-size", "64", "--steps", "120"]}
REDUCED = {"resnet50": ["--model", "resnet50", "--width", "0.125", "--image-size", "64", "--batch-size", "4",
                        "--steps", "40"],
           "swin_t": ["--model", "swin_t", "--width", "0.125", "--depths", "1,1,1,1", "--batch-size", "2",
                      "--steps", "40"]}
REDUCED_TUNE = ["--trials", "2", "--confirm-rounds", "2", "--warmup-steps", "2", "--steps-per-trial", "3",
                "--target-rse", "0", "--profile-steps", "1"]


def perfscope(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """Run ``python -m perfscope ARGS`` from the checkout; its output is kept for the record."""
    return subprocess.run([sys.executable, "-m", "perfscope", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def profile_numbers(out: Path) -> dict:
    """Verdict, step time (ms) and MFU of a profile's ``summary.json`` (None where absent)."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {"verdict": None, "step_ms": None, "mfu": None}
    overall, mfu = summary.get("overall") or {}, (summary.get("details") or {}).get("mfu") or {}
    step = overall.get("step_time_us")
    return {"verdict": overall.get("verdict"), "step_ms": step / 1000 if step else None, "mfu": mfu.get("mfu"),
            "mfu_peak": mfu.get("peak_math")}


def prove_model(name: str, script_args: list[str], out: Path, *, reduced: bool, budget_s: float,
                run_steps: int) -> dict:
    """Steps 1-3 of the module docstring for one model; every command's status is recorded."""
    row: dict = {"model": name, "args": script_args, "errors": []}
    started = time.monotonic()
    before = perfscope("profile", "--out", str(out / "before"), EXAMPLE, "--", *script_args, timeout=600)
    if before.returncode != 0:
        row["errors"].append(f"profile: {before.stderr.strip().splitlines()[-1:]}")
    row["before"] = profile_numbers(out / "before")
    tune_args = ["tune", EXAMPLE, "--out", str(out / "tune"), "--run-steps", str(run_steps), "--no-progress",
                 "--time-budget", str(budget_s), "--confirm-budget", str(budget_s / 2)]
    tuned = perfscope(*tune_args, *(REDUCED_TUNE if reduced else []), "--", *script_args, timeout=4 * budget_s + 600)
    if tuned.returncode != 0:
        row["errors"].append(f"tune: {tuned.stderr.strip().splitlines()[-1:]}")
    try:
        record = json.loads((out / "tune" / "tune.json").read_text())
    except (OSError, ValueError):
        record = {}
    rec = record.get("recommendation") or {}
    row["tune"] = {"status": rec.get("status"), "config": rec.get("config") or {}, "speedup": rec.get("speedup"),
                   "ci_low": rec.get("ci_low"), "ci_high": rec.get("ci_high"), "line": rec.get("line"),
                   "compile_s": (rec.get("startup") or {}).get("extra_s"),
                   "searched": [k.get("name") for k in (record.get("space") or {}).get("searched") or []]}
    row["after"] = dict(row["before"])
    if row["tune"]["config"]:
        after = perfscope("profile", "--config", str(out / "tune" / "best.yaml"), "--out", str(out / "after"),
                          EXAMPLE, "--", *script_args, timeout=600)
        if after.returncode != 0:
            row["errors"].append(f"profile --config: {after.stderr.strip().splitlines()[-1:]}")
        row["after"] = profile_numbers(out / "after")
    row["seconds"] = round(time.monotonic() - started, 1)
    return row


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def table(rows: list[dict]) -> str:
    """The results as a Markdown table."""
    lines = ["| model | verdict before -> after | proven speed-up | configuration | compile s | MFU before -> after |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        t = r["tune"]
        gain = ("undecided (a budget ended its confirmation)" if t["status"] == "undecided" else
                "keep current" if t["status"] != "faster" else
                f"{t['speedup']:.2f}x ({t['ci_low']:.2f}x-{t['ci_high']:.2f}x)")
        config = ", ".join(f"{k}: {v}" for k, v in t["config"].items()) or "-"
        compile_s = "-" if t["compile_s"] is None else f"{t['compile_s']:.1f}"
        lines.append(f"| {r['model']} | {r['before']['verdict']} -> {r['after']['verdict']} | {gain} | {config} | "
                     f"{compile_s} | {_pct(r['before']['mfu'])} -> {_pct(r['after']['mfu'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("perfscope-out/gpu-proof"))
    parser.add_argument("--reduced", action="store_true", help="CPU mode: reduced models and a two-trial tune")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds of tuning per model (default 150)")
    parser.add_argument("--run-steps", type=int, default=10_000, help="training run the compile time is weighed over")
    parser.add_argument("--models", default="resnet50,swin_t")
    args = parser.parse_args(argv)
    sizes = REDUCED if args.reduced else FULL
    rows = []
    for name in args.models.split(","):
        if name not in sizes:
            print(f"gpu_proof: unknown model {name!r} (known: {', '.join(sizes)})", file=sys.stderr)
            return 2
        rows.append(prove_model(name, sizes[name], args.out / name, reduced=args.reduced, budget_s=args.budget,
                                run_steps=args.run_steps))
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(rows)
    (args.out / "gpu-proof.json").write_text(json.dumps(rows, indent=2))
    (args.out / "gpu-proof.md").write_text(text + "\n")
    print(text)
    for r in rows:
        for e in r["errors"]:
            print(f"gpu_proof: {r['model']}: {e}", file=sys.stderr)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
