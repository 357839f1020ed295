"""The fused knob group: perfscope.accelerate swaps the fused window attention in and replaces the
optimizer by LAMB/LARS with the documented learning-rate rule; launch-time patching swaps the first
model the script calls; the measurement records which modules are fusable, and the tuner searches
and guesses the knob from it."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from perfscope import fused_ops
from perfscope.fused_ops.swin import SwinBlock
from perfscope.analysis.patterns import match_spans
from perfscope.runtime.accelerator import accelerate, active_accelerator
from perfscope.runtime.patching import patched
from runtimekit import clean_state, mlp  # noqa: F401 (clean_state: autouse fixture)
from perfscope.tuner.space import build_space, rule_based_guess

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def swin() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(SwinBlock(16, (14, 14), 2, 7, 0), SwinBlock(16, (14, 14), 2, 7, 3))


def test_accelerate_swaps_the_window_attention_and_keeps_the_outputs():
    model, x = swin(), torch.randn(2, 196, 16)
    expected = model(x)
    model, _, _ = accelerate(model, config={"fused_ops": True})
    assert "2 module(s): 0.attn, 1.attn" in active_accelerator().applied["fused_ops"]
    assert isinstance(model[1].attn, fused_ops.FusedWindowAttention)
    torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


def test_a_model_without_window_attention_is_named_as_skipped():
    accelerate(mlp(), config={"fused_ops": True})
    assert "no window attention" in active_accelerator().skipped["fused_ops"]


@pytest.mark.parametrize(("name", "make", "accum", "factor"), [
    ("lamb", lambda p: torch.optim.AdamW(p, lr=1e-3, betas=(0.8, 0.99), weight_decay=0.05), 4, math.sqrt(4)),
    ("lars", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, weight_decay=1e-4), 4, 4.0),
    ("lamb", lambda p: torch.optim.Adam(p, lr=1e-3), 1, 1.0),
])
def test_the_large_batch_optimizer_keeps_the_scripts_hyperparameters_and_scales_the_rate(name, make, accum, factor):
    model = mlp()
    original = make(model.parameters())
    lr = original.param_groups[0]["lr"]
    scheduler = torch.optim.lr_scheduler.StepLR(original, step_size=10)  # built on the script's optimizer
    _, optimizer, _ = accelerate(model, original, config={"optimizer": name, "grad_accum_steps": accum})
    inner = optimizer.optimizer
    assert type(inner) is {"lamb": fused_ops.Lamb, "lars": fused_ops.Lars}[name]
    assert inner.param_groups is original.param_groups  # the scheduler still drives it
    assert inner.param_groups[0]["lr"] == pytest.approx(lr)  # the schedule's value, untouched
    assert inner.param_groups[0]["lr_scale"] == pytest.approx(factor)  # the batch rule's factor
    if name == "lamb":
        assert inner.param_groups[0]["betas"] == original.defaults["betas"]
    else:
        assert inner.param_groups[0]["momentum"] == 0.8
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(accum):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    scheduler.step()
    assert "learning rate x" in active_accelerator().applied["optimizer"]


def test_a_warm_up_from_zero_keeps_its_schedule_and_gets_the_factor():
    model = mlp()
    original = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(original, lambda step: min(1.0, step / 4))  # lr 0 at first
    _, optimizer, _ = accelerate(model, original, config={"optimizer": "lamb", "grad_accum_steps": 4})
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(4):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # lr 0: nothing moved
    for _ in range(8):
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)
    assert optimizer.optimizer.param_groups[0]["lr_scale"] == pytest.approx(2.0)


@pytest.mark.parametrize(("make", "why"), [
    (lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True), "amsgrad"),
    (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True), "Nesterov"),
])
def test_settings_without_a_counterpart_keep_the_scripts_optimizer(make, why):
    model = mlp()
    config = {"optimizer": "lamb" if why == "amsgrad" else "lars"}
    _, optimizer, _ = accelerate(model, make(model.parameters()), config=config)
    assert why in active_accelerator().skipped["optimizer"]
    assert type(optimizer.optimizer).__module__.startswith("torch.optim")


def test_a_large_batch_optimizer_of_another_family_is_named_as_skipped():
    model = mlp()
    accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), config={"optimizer": "lamb"})
    assert "Adam or AdamW" in active_accelerator().skipped["optimizer"]


def test_at_launch_the_first_model_called_is_swapped_and_the_hook_goes():
    with patched({"fused_ops": True}) as report:
        model = swin()
        model(torch.randn(1, 196, 16))
        assert isinstance(model[0].attn, fused_ops.FusedWindowAttention)
        assert "2 module(s)" in report.applied["fused_ops"]
        later = swin()
        later(torch.randn(1, 196, 16))  # the hook removed itself after the first model
        assert type(later[0].attn) is fused_ops.WindowAttention
    with patched({"fused_ops": True}) as report:
        mlp()(torch.randn(2, 8))
        assert "fused_ops" not in report.applied and "no window attention" in report.not_applied["fused_ops"]


def test_the_pattern_needs_the_gathered_bias():
    window = ["aten::mul", "aten::transpose", "aten::matmul", "aten::view", "aten::index", "aten::permute",
              "aten::add", "aten::softmax", "aten::matmul"]
    assert match_spans(_names(window * 2)) == [(0, 8, [2, 8]), (9, 17, [11, 17])]
    plain_attention = ["aten::matmul", "aten::div", "aten::add", "aten::softmax", "aten::matmul"]
    assert match_spans(_names(plain_attention)) == []
    gathered_first = ["aten::index", "aten::view", "aten::pad", "aten::roll", "aten::linear", "aten::mul", "aten::matmul",
                      "aten::add", "aten::zeros", "aten::sub", "aten::add", "aten::softmax", "aten::matmul"]  # torchvision
    assert match_spans(_names(gathered_first)) == [(5, 12, [6, 12])]


def _names(names):
    import numpy as np

    return np.array(names, dtype=object)


@pytest.mark.slow
def test_the_measurement_sees_the_fusable_modules_and_the_tuner_searches_and_guesses_the_knob(tmp_path):
    from perfscope.measure import runner as measure

    res = measure.measure_in_process(EXAMPLES / "swin.py", ["--steps", "6", "--depth", "1", "--batch-size", "2"],
                                     record_dir=tmp_path, warmup_steps=1, measure_steps=2)
    assert res["exit_code"] == 0
    facts = res["facts"]
    assert facts["model"] == {"class": "TinySwin", "fusable": ["blocks.0.attn", "blocks.1.attn"], "not_fusable": {},
                              "compiled": False, "fsdp": None, "convolutions": 1,
                              "channels_last": False}  # its patch embedding
    space = build_space(facts, {"compute": 0.9, "launch": 0.1}, "compute-bound", cpu_count=2)
    assert "fused_ops" in {k.name for k in space.knobs}
    assert rule_based_guess(space, facts, cpu_count=2, fractions={"compute": 0.9, "launch": 0.1})["fused_ops"] is True
    plain = dict(facts, model={"class": "Sequential", "fusable": [], "not_fusable": {}})
    assert "no window attention" in build_space(plain, {"compute": 1.0}, "compute-bound").excluded["fused_ops"]
    assert sys.modules.get("perfscope.fused_ops") is not None
