"""Helpers of the measurement-runner tests (``test_measure_*.py``): running
``python -m perfscope.measure``, reading the records it writes, and a clean environment
for every test (the autouse fixture, imported by each of those modules)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
LOOP = ROOT / "tests" / "scripts" / "measure_loop.py"


@pytest.fixture(autouse=True)
def no_config_from_env(monkeypatch):
    """No config, rank or world size from the environment; no accelerator left active after."""
    monkeypatch.delenv("PERFSCOPE_CONFIG", raising=False)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    yield
    from perfscope.runtime import accelerator

    accelerator._active = None


def run_cli(record_dir: Path, *options: str, script: Path, args=(), launcher=()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PERFSCOPE_CONFIG", "RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, *launcher, "-m", "perfscope.measure", "--record-dir", str(record_dir),
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
