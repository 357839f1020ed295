"""Hand-written trace cases: the optimizer's step (perfscope/analysis/optimizer_step.py) -- its
share of the step, the implementation its operators show, and the advice with the what-if bound
(see tracekit.py). Times are µs."""

from __future__ import annotations

import json

import pytest
from tracegen import annotation, cpu_op, step
from tracekit import analyze

from perfscope.analysis.optimizer_step import MIN_OPERATORS, implementation, optimizer_class


def _cpu_steps(optimizer_ops: list[str], steps=(1, 2, 3), name="Optimizer.step#AdamW.step", cat="user_annotation",
               wrapper: str | None = None):
    """Steps of 1000 µs: a forward operator [t0+10, t0+410), then the optimizer's range
    [t0+450, t0+950) holding ``optimizer_ops`` of 4 µs each, back to back."""
    events = []
    for n in steps:
        t0 = 1000 * (n - 1)
        events += [step(n, t0, 1000), cpu_op("aten::addmm", t0 + 10, 400)]
        if wrapper:
            events.append(annotation(wrapper, t0 + 440, 520, cat=cat))
        events.append(annotation(name, t0 + 450, 500, cat=cat))
        events += [cpu_op(op, t0 + 452 + 4 * i, 4) for i, op in enumerate(optimizer_ops)]
    return events


def test_a_for_loop_step_is_measured_and_advised_with_its_bound(tmp_path):
    ops = ["aten::mul_", "aten::add_", "aten::lerp_"] * 40  # 120 operators: a for-loop over 40 tensors
    a = analyze(tmp_path, _cpu_steps(ops))
    found = a.summary()["details"]["facts"]["optimizer_step"]
    # 500 of every 1000 µs step; without it the steps are 500 µs: the bound is 2x
    assert found["classes"] == ["AdamW"] and found["implementation"] == "for-loop"
    assert found["operators_per_step"] == 120 and found["optimizer_us_per_step"] == pytest.approx(500)
    assert found["share"] == pytest.approx(0.5)
    assert found["step_time_us"] == pytest.approx(1000) and found["step_time_without_us"] == pytest.approx(500)
    assert found["speedup"] == pytest.approx(2.0)
    advice = a.summary()["details"]["advice"]
    for cls in ("launch", "compute"):
        assert advice[cls].startswith("Run the optimizer as one fused step: AdamW's step takes 50% of the step")
        assert "optimizer_impl: fused" in advice[cls] and "1.0 ms -> at best 0.5 ms, about 2.00x" in advice[cls]
    assert "optimizer_impl" not in advice["io"]


@pytest.mark.parametrize(("ops", "impl"), [
    (["aten::_fused_adamw_"], "fused"),
    (["aten::_foreach_mul_", "aten::_foreach_add_"] * 40, "foreach"),
])
def test_a_fused_or_multi_tensor_step_is_named_so_and_not_advised(tmp_path, ops, impl):
    a = analyze(tmp_path, _cpu_steps(ops))
    assert a.summary()["details"]["facts"]["optimizer_step"]["implementation"] == impl
    assert "optimizer_impl" not in a.summary()["details"]["advice"]["launch"]


def test_a_small_for_loop_step_is_not_advised(tmp_path):
    a = analyze(tmp_path, _cpu_steps(["aten::add_"] * (MIN_OPERATORS - 1)))
    assert a.summary()["details"]["facts"]["optimizer_step"]["share"] == pytest.approx(0.5)
    assert "optimizer_impl" not in a.summary()["details"]["advice"]["launch"]


def test_a_wrapper_around_the_optimizer_is_counted_once_and_2021_traces_are_read(tmp_path):
    # an EMA wrapper's range [t0+440, t0+960) holds the inner optimizer's: 520 µs a step, not 1020;
    # the 2021 layout writes both ranges as operators ("Operator")
    a = analyze(tmp_path, _cpu_steps(["aten::add_"] * 100, cat="Operator", wrapper="Optimizer.step#EMA.step"))
    found = a.summary()["details"]["facts"]["optimizer_step"]
    assert found["optimizer_us_per_step"] == pytest.approx(520) and found["classes"] == ["EMA"]
    assert found["operators_per_step"] == 100  # the inner range, an "Operator" there too, is not one


def test_a_trace_without_an_optimizer_range_has_no_fact(tmp_path):
    a = analyze(tmp_path, [e for n in (1, 2) for e in (step(n, 1000 * n, 1000), cpu_op("aten::addmm", 1000 * n + 10, 900))])
    assert a.summary()["details"]["facts"]["optimizer_step"] is None


def test_names():
    assert optimizer_class("Optimizer.step#SGD.step") == "SGD"
    assert optimizer_class("Optimizer.zero_grad#SGD.zero_grad") is None
    assert implementation(["aten::add_"], "FusedAdam") == "fused"  # apex: kernels outside ATen
    assert implementation(["aten::_foreach_add_", "aten::add_"]) == "foreach"
    assert implementation([]) == "for-loop"


def test_a_closure_inside_the_optimizers_step_is_not_the_optimizers_time(tmp_path):
    # optimizer.step(closure): the range holds the forward (400 us), the backward (400 us) and then the
    # update (100 us of for-loop operators): only the update is the optimizer's
    from tracegen import annotation, cpu_op, step
    from tracekit import analyze

    events = []
    for n in range(3):
        s = 1000 * n
        events += [step(n + 1, s, 1000), annotation("Optimizer.step#SGD.step", s + 10, 950),
                   cpu_op("aten::linear", s + 20, 380),
                   cpu_op("autograd::engine::evaluate_function: AddmmBackward0", s + 420, 400),
                   *[cpu_op("aten::add_", s + 850 + 10 * k, 9) for k in range(10)]]
    a = analyze(tmp_path, events)
    cost = a.summary()["details"]["facts"]["optimizer_step"]
    assert cost["closure"] is True
    assert cost["optimizer_us_per_step"] == pytest.approx(140, abs=1)  # from the backward's end to the range's end
    assert cost["operators_per_step"] == 10 and cost["share"] == pytest.approx(0.14, abs=0.01)
    assert "fused step" not in a.verdict.advice


def _profiled(tmp_path, script: str) -> dict:
    """The summary of ``perfscope profile --max-steps 0`` of a script of ``tests/scripts``, with one
    intra-op thread: on a busy machine its steps then get a provisional verdict, which workers that
    wait for cores can withhold (docs/metrics.md, "Intra-op workers that wait")."""
    from tunekit import ROOT, run_perfscope

    out = tmp_path / "out"
    done = run_perfscope("profile", "--out", str(out), "--max-steps", "0", str(ROOT / "tests" / "scripts" / script),
                         cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def _phase_shares(summary: dict) -> dict:
    (view,) = summary["details"]["run_steps"]
    return {k: v["share"] for k, v in view["phases"].items()}


@pytest.mark.slow
def test_a_profiled_closure_loop_keeps_forward_and_backward_out_of_the_optimizer(tmp_path):
    summary = _profiled(tmp_path, "closure_loop.py")
    cost = summary["details"]["facts"]["optimizer_step"]
    assert cost["closure"] is True and cost["share"] < 0.5, cost
    assert "fused step" not in summary["overall"]["advice"]
    share = _phase_shares(summary)
    # The closure's forward and backward are read as such (the bug: optimizer 99-100%, both 0%). No
    # tighter bounds: beside busy processes the shares move far (seen: forward 0.09-0.35, backward
    # 0.09-0.42, optimizer 0.15-0.45), the rest going to 'other'.
    assert share["optimizer"] < 0.6 and share["forward"] > 0.02 and share["backward"] > 0.02, share


@pytest.mark.slow
def test_a_lightning_trainers_closure_is_read_as_forward_and_backward(tmp_path):
    from pg import in_ci

    try:
        import lightning  # noqa: F401
    except ImportError:
        if in_ci():
            pytest.fail("CI is set but lightning is missing; .ci/run should have installed it", pytrace=False)
        pytest.skip("lightning is not installed (pip install -c .ci/constraints.txt lightning)")
    summary = _profiled(tmp_path, "lightning_train.py")
    cost = summary["details"]["facts"]["optimizer_step"]
    assert cost["closure"] is True and cost["share"] < 0.5, cost  # was 99-100%: the closure counted as the optimizer
    assert cost["step_time_without_us"] > 0.3 * cost["step_time_us"]  # never "at best 0.0 ms"
    share = _phase_shares(summary)
    # The closure's forward and backward are read as such (the bug: optimizer 99-100%, both 0%). No
    # tighter bounds: beside busy processes the shares move far (seen: forward 0.09-0.35, backward
    # 0.09-0.42, optimizer 0.15-0.45), the rest going to 'other'.
    assert share["optimizer"] < 0.6 and share["forward"] > 0.02 and share["backward"] > 0.02, share
