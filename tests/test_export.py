"""Experiment trackers (perfscope.export): the contract on MLflow (a SQLite store read back with
MlflowClient) and on W&B (an offline run folder read back record by record): every parameter,
tag, step metric at its step, summary value and artifact is there, and children are runs linked
to their parent; what a profile and a tune folder give; `perfscope export` and `--export`; a
missing library is one line naming the extra. MLflow and W&B are installed in CI
(`.ci/run`, with the constraints that keep the CPU torch); elsewhere these tests skip without them."""

from __future__ import annotations

import glob
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from emulated import in_ci

from perfscope.export import RunExport, StepMetrics, read_export, tracker
from perfscope.export.base import TrackerUnavailable

ROOT = Path(__file__).resolve().parents[1]


def _need(module: str):
    if in_ci():
        return __import__(module)
    return pytest.importorskip(module)


def _run(tmp_path) -> RunExport:
    art = tmp_path / "report.html"
    art.write_text("<html>report</html>")
    kids = [RunExport(name=f"trial {i}", params={"config.num_workers": str(i)}, tags={"perfscope.state": "complete"},
                      steps=[StepMetrics(step=1, values={"value": 10.0 * i})], summary={"value": 10.0 * i})
            for i in (1, 2)]
    return RunExport(name="train", params={"script": "train.py", "args": "--lr 0.1"},
                     tags={"perfscope.verdict": "io-bound", "perfscope.provisional": "false"},
                     steps=[StepMetrics(step=s, values={"step_time_ms": 50.0 + s, "share/io": 0.5}) for s in (6, 7, 8)],
                     summary={"median_step_ms": 57.0, "cost_per_step_usd": 0.0001}, artifacts=[str(art)], children=kids)


# ------------------------------------------------------------------ MLflow


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    _need("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # a SQLite store keeps artifacts in ./mlruns of the current folder
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_mlflow_holds_every_part_of_the_run_and_its_children(tmp_path, mlflow_store):
    run = _run(tmp_path)
    said = tracker("mlflow").log(run, experiment="perfscope-test")
    client = mlflow_store
    exp = client.get_experiment_by_name("perfscope-test")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.info.run_name == "train"]
    assert parent.info.run_id in said and parent.info.status == "FINISHED"
    assert parent.data.params == run.params
    assert {k: v for k, v in parent.data.tags.items() if k.startswith("perfscope.")} == run.tags
    history = client.get_metric_history(parent.info.run_id, "step_time_ms")
    assert sorted((m.step, m.value) for m in history) == [(6, 56.0), (7, 57.0), (8, 58.0)]
    assert parent.data.metrics["median_step_ms"] == 57.0 and parent.data.metrics["cost_per_step_usd"] == 0.0001
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == ["report.html"]
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert sorted(r.info.run_name for r in kids) == ["trial 1", "trial 2"]
    assert {r.data.params["config.num_workers"]: r.data.metrics["value"] for r in kids} == {"1": 10.0, "2": 20.0}


# ------------------------------------------------------------------ W&B (offline)


def _wandb_records(run_dir: Path) -> list:
    """The records of an offline run's ``run-*.wandb`` (W&B's log: 32 KiB blocks of chunks with a
    7-byte header -- checksum, length, type: 1 whole, 2 first, 3 middle, 4 last), as protobufs."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(str(run_dir / "run-*.wandb"))
    data, block, pos, out, partial = Path(path).read_bytes(), 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        chunk, pos = data[pos:pos + length], pos + length
        if kind == 1:
            out.append(chunk)
        elif kind in (2, 3):
            partial = (b"" if kind == 2 else partial) + chunk
        elif kind == 4:
            out.append(partial + chunk)
    records = []
    for raw in out:
        rec = pb.Record()
        rec.ParseFromString(raw)
        records.append(rec)
    return records


def _wandb_run(run_dir: Path) -> dict:
    """config, history (step -> values), summary, artifact files and group of an offline run."""
    got = {"config": {}, "history": {}, "summary": {}, "artifacts": [], "group": None, "name": None}
    for rec in _wandb_records(run_dir):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            got["name"], got["group"] = rec.run.display_name, rec.run.run_group
            got["config"].update({u.key: json.loads(u.value_json) for u in rec.run.config.update})
        elif kind == "config":
            got["config"].update({u.key: json.loads(u.value_json) for u in rec.config.update})
        elif kind == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            got["history"][int(items["_step"])] = items
        elif kind == "summary":
            got["summary"].update({(u.key or "/".join(u.nested_key)): json.loads(u.value_json)
                                   for u in rec.summary.update})
        elif kind == "artifact":
            got["artifacts"] += [e.path for e in rec.artifact.manifest.contents]
    return got


def test_wandb_offline_holds_every_part_of_the_run_and_its_children(tmp_path, monkeypatch):
    _need("wandb")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = _run(tmp_path)
    said = tracker("wandb").log(run, experiment="perfscope-test")
    assert "offline" in said
    runs = {}
    for folder in (tmp_path / "wandb").glob("offline-run-*"):
        got = _wandb_run(folder)
        runs[got["name"]] = got
    parent = runs["train"]
    assert {k: parent["config"][k] for k in run.params} == run.params
    assert parent["config"]["tags/perfscope.verdict"] == "io-bound"
    assert {s: h["step_time_ms"] for s, h in parent["history"].items()} == {6: 56.0, 7: 57.0, 8: 58.0}
    assert parent["summary"]["median_step_ms"] == 57.0 and parent["summary"]["cost_per_step_usd"] == 0.0001
    assert parent["artifacts"] == ["report.html"]
    kids = [runs["trial 1"], runs["trial 2"]]
    assert all(k["group"] and k["group"] in said for k in kids)  # in the parent's group
    assert [k["summary"]["value"] for k in kids] == [10.0, 20.0]


# ------------------------------------------------------------------ what the folders give, the commands


def test_a_missing_library_is_one_line_naming_the_extra(monkeypatch, tmp_path):
    for name, module in (("mlflow", "mlflow"), ("wandb", "wandb")):
        for loaded in [m for m in sys.modules if m == module or m.startswith(module + ".")] or [module]:
            monkeypatch.setitem(sys.modules, loaded, None)  # as if not installed, even after another test used it
        with pytest.raises(TrackerUnavailable, match=rf"pip install 'perfscope-torch\[{name}\]'"):
            tracker(name).log(_run(tmp_path), experiment="x")


def test_a_profile_folder_gives_its_params_tags_steps_and_figures(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "perfscope", "analyze", str(ROOT / "evals" / "traces" / "cpu-io.json.gz"),
                           "--price-per-hour", "2", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    run = read_export(out)
    summary = json.loads((out / "summary.json").read_text())
    assert run.tags["perfscope.verdict"] == "io-bound" and run.tags["perfscope.command"] == "analyze"
    assert [m.step for m in run.steps] == [s["step"] for s in summary["steps"]]
    assert run.steps[0].values["step_time_ms"] == pytest.approx(summary["steps"][0]["step_time_us"] / 1000)
    assert run.summary["cost_per_step_usd"] == pytest.approx(summary["details"]["cost"]["per_step"])
    assert sorted(Path(a).name for a in run.artifacts) == ["report.html", "summary.json"]


def test_a_tune_folder_is_a_parent_with_a_child_per_trial(tmp_path):
    from test_tune_flow import options

    from perfscope.testing.trials import SimulatedRunner
    from perfscope.tuner.tune import tune

    out = tmp_path / "out"
    record = tune(options(out, trials=4, price_per_hour=1.0), runner=SimulatedRunner())
    run = read_export(out)
    assert run.tags["perfscope.command"] == "tune" and run.tags["perfscope.recommendation"] == record["recommendation"]["status"]
    assert len(run.children) == len(record["trials"])
    assert run.children[0].params["role"] == "baseline" and "value" in run.children[0].summary
    assert run.summary["cost_per_1000_baseline_usd"] == pytest.approx(record["cost"]["baseline"])


def test_export_of_a_folder_without_a_record_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "perfscope", "export", str(tmp_path), "--to", "mlflow"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "neither summary.json nor tune.json" in done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.slow
def test_profile_export_mlflow_logs_the_run_it_profiled(tmp_path):
    _need("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**__import__("os").environ, "MLFLOW_TRACKING_URI": uri}
    done = subprocess.run([sys.executable, "-m", "perfscope", "profile", "--out", str(tmp_path / "out"), "--export",
                           "mlflow", "--experiment", "io", str(ROOT / "examples" / "io_bound.py"), "--", "--steps", "30"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)  # ./mlruns there
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exported: MLflow run" in done.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("io").experiment_id])
    assert run.data.tags["perfscope.verdict"] == "io-bound" and run.data.params["args"] == "--steps 30"
    phases = client.get_metric_history(run.info.run_id, "run/input_s")
    lines = (tmp_path / "out" / "traces" / "rank0.run.jsonl").read_text().splitlines()
    assert len(phases) == len(lines) >= 10  # every step of the whole run, with its input phase


def test_tune_export_logs_a_parent_and_a_child_per_trial(tmp_path, mlflow_store, capsys):
    # what `perfscope tune --export mlflow` does when the tune has written its outputs
    import types

    from test_tune_flow import options

    from perfscope.cli.export import export_after
    from perfscope.testing.trials import SimulatedRunner
    from perfscope.tuner.tune import tune

    out = tmp_path / "out"
    record = tune(options(out, trials=4), runner=SimulatedRunner())
    assert export_after(types.SimpleNamespace(export="mlflow", experiment="tunes"), out, 0) == 0
    assert "exported: MLflow run" in capsys.readouterr().err
    runs = mlflow_store.search_runs([mlflow_store.get_experiment_by_name("tunes").experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(kids) == len(record["trials"]) and parent.data.tags["perfscope.command"] == "tune"
    written = sorted(name for name in ("best.yaml", "report.html", "tune.json") if (out / name).is_file())
    assert "tune.json" in written
    assert sorted(a.path for a in mlflow_store.list_artifacts(parent.info.run_id)) == written


def test_a_failed_export_after_a_run_is_one_line_and_keeps_the_outputs(tmp_path, capsys):
    import types

    from perfscope.cli.export import export_after

    assert export_after(types.SimpleNamespace(export="mlflow", experiment="x"), tmp_path, 0) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("perfscope: export to mlflow failed:") and "tries again" in err[0]
    assert export_after(types.SimpleNamespace(export=None, experiment="x"), tmp_path, 3) == 3  # no --export
