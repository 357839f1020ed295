"""Shared helpers of the collection tests: tiny training scripts and trace readers."""

from __future__ import annotations

import gzip
import json
import pathlib
import textwrap

from perfscope.collect import ProfileSchedule

SMALL = ProfileSchedule(skip_first=1, warmup=1, active=3)

# A DataLoader + module + SGD loop; ITERATIONS and the body's extras are
# filled in per test. Written so that each iteration is one training step.
LOOP = """
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=4)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
it = 0
while it < {iterations}:
    for x, y in loader:
        it += 1
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        {extra}
        if it >= {iterations}:
            break
"""


def write_script(tmp_path: pathlib.Path, body: str, name: str = "train.py") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def loop_script(tmp_path: pathlib.Path, iterations: int | str = 10**6, extra: str = "pass") -> pathlib.Path:
    return write_script(tmp_path, LOOP.format(iterations=iterations, extra=extra))


def trace_events(path: pathlib.Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def profiler_steps(events: list[dict]) -> list[dict]:
    return sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])


def within(event: dict, span: dict) -> bool:
    return span["ts"] <= event["ts"] and event["ts"] + event["dur"] <= span["ts"] + span["dur"]


def assert_no_straddling(events: list[dict]) -> list[dict]:
    steps = profiler_steps(events)
    for a, b in zip(steps, steps[1:]):
        assert a["ts"] + a["dur"] <= b["ts"], f"{a['name']} overlaps {b['name']}"
    for e in events:
        if e["name"].startswith(("Optimizer.step#", "enumerate(DataLoader)#")):
            inside = [s["name"] for s in steps if within(e, s)]
            assert len(inside) == 1, f"{e['name']} at {e['ts']} is not inside one step: {inside}"
    return steps


def count_in(events: list[dict], span: dict, prefix: str) -> int:
    return sum(1 for e in events if e["name"].startswith(prefix) and within(e, span))
