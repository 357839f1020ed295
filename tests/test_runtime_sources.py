"""The acceleration runtime on CPU, where its config comes from: a dict, an AccelConfig, a YAML file
or PERFSCOPE_CONFIG (also for the example script); no config leaves everything unchanged; bad
configs, bad YAML and a second accelerate are errors that name the key and the allowed values."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
from runtimekit import (
    ROOT,
    clean_state,  # noqa: F401 (autouse fixture)
    mlp,
    shuffled_loader,
)

import perfscope
from perfscope.runtime.accelerator import AcceleratedOptimizer, AlreadyAcceleratedError
from perfscope.runtime.config import AccelConfig, ConfigError, save_config
from conftest import HANG_TIMEOUT_S  # noqa: E402

# --- configuration sources and errors -------------------------------------------------------------


def test_import_perfscope_does_not_import_torch():
    code = "import sys, perfscope; perfscope.accelerate; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("source", ["dict", "object", "yaml", "env"])
def test_config_sources(source, tmp_path, monkeypatch):
    cfg = AccelConfig(amp_level="O1", grad_accum_steps=2)
    path = save_config(cfg, tmp_path / "c.yaml")
    config = {"dict": cfg.to_dict(), "object": cfg, "yaml": str(path), "env": None}[source]
    if source == "env":
        monkeypatch.setenv("PERFSCOPE_CONFIG", str(path))
    model = mlp()
    _, opt, _ = perfscope.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), config=config)
    acc = perfscope.accelerator()
    assert acc.config == cfg and isinstance(opt, AcceleratedOptimizer)
    assert set(acc.applied) == {"amp_level", "grad_accum_steps"}


def test_no_config_returns_objects_unchanged():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = shuffled_loader()
    assert perfscope.accelerate(model, opt, loader) == (model, opt, loader)
    assert perfscope.accelerator() is None
    with perfscope.autocast():  # no-ops without an accelerator
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("config, words", [
    ({"num_worker": 2}, ["'num_worker'", "allowed keys", "num_workers"]),
    ({"amp_level": "O3"}, ["'amp_level'", "O0, O1, O2"]),
    ({"amp_dtype": "fp8"}, ["'amp_dtype'", "bf16, fp16"]),
    ({"grad_accum_steps": 0}, ["'grad_accum_steps'", "integer >= 1"]),
    ({"grad_compression": "int8"}, ["'grad_compression'", "none, fp16, bf16"]),
    ({"num_workers": 0, "prefetch_factor": 4}, ["'prefetch_factor'", "num_workers > 0"]),
])
def test_bad_configs_name_key_and_allowed_values(config, words):
    with pytest.raises(ConfigError) as err:
        perfscope.accelerate(mlp(), config=config)
    for word in words:
        assert word in str(err.value)


def test_o2_without_optimizer_is_an_error():
    with pytest.raises(ConfigError, match="'amp_level'.*'O2'.*optimizer.*O0 or O1"):
        perfscope.accelerate(mlp(), None, config={"amp_level": "O2"})


def test_bad_yaml_file(tmp_path):
    (tmp_path / "c.yaml").write_text("amp_level: [O1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        perfscope.accelerate(mlp(), config=tmp_path / "c.yaml")


def test_double_accelerate_is_an_error():
    model = mlp()
    model2, opt, loader = perfscope.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                               shuffled_loader(), config={"num_workers": 1})
    for args in [(model2,), (mlp(), opt), (mlp(), None, loader)]:
        with pytest.raises(AlreadyAcceleratedError, match="already accelerated"):
            perfscope.accelerate(*args, config={"tf32": True})


# --- the example ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_accelerated_example_runs(tmp_path):
    save_config(AccelConfig(num_workers=2, amp_level="O1", grad_accum_steps=2), tmp_path / "c.yaml")
    env = {**os.environ, "PERFSCOPE_CONFIG": str(tmp_path / "c.yaml")}
    out = subprocess.run([sys.executable, "examples/accelerated.py", "--steps", "4", "--decode-ms", "0"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT_S, check=True).stdout
    assert "applied num_workers" in out and "step 4: loss" in out
