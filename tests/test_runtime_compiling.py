"""The compile knob (``compile``): which models it compiles and why not, the facts the tuner
reads, the first guess, and (slow tier: inductor takes seconds to compile) a model compiled at
launch that trains as the eager one and reports its compile time."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from perfscope.measure.facts import model_facts
from perfscope.runtime import compiling
from perfscope.runtime.accelerator import accelerate, active_accelerator
from perfscope.runtime.groups import CompileGroup
from perfscope.runtime.patching import patched
from perfscope.record.run_facts import run_facts
from runtimekit import clean_state, mlp  # noqa: F401 (autouse fixture)


def test_why_a_model_is_not_compiled(monkeypatch):
    assert compiling.why_not(mlp(), "reduce-overhead") == "reduce-overhead records CUDA graphs: the model is not on a GPU"
    assert compiling.why_not(torch.compile(mlp()), "default") == "the model is compiled already (the script's own torch.compile)"
    monkeypatch.setattr(compiling.shutil, "which", lambda name: None)
    assert compiling.why_not(mlp(), "default") == ("torch.compile needs a C++ compiler for CPU code "
                                                   "(none of $CXX, g++, c++, clang++)")


def test_the_facts_say_whether_the_script_compiled_its_model():
    assert model_facts(mlp())["compiled"] is False
    assert model_facts(torch.compile(mlp()))["compiled"] is True
    model = mlp()
    model.compile()
    assert model_facts(model)["compiled"] is True


def test_accelerate_compiles_the_forward_in_place_and_names_what_it_cannot():
    model = mlp()
    keys = list(model.state_dict())
    returned, _, _ = accelerate(model, config={"compile": "default"})
    assert returned is model and list(model.state_dict()) == keys  # no _orig_mod. prefix
    assert active_accelerator().applied["compile"] == ("forward of Sequential compiled with torch.compile "
                                                       "(mode default) at its first call")
    assert compiling.why_not(model, "default").startswith("the model is compiled already")
    model = mlp()
    accelerate(model, config={"compile": "reduce-overhead"})
    assert active_accelerator().skipped["compile"].startswith("reduce-overhead records CUDA graphs")


@pytest.mark.parametrize(("facts", "bottlenecks", "expected"), [
    ({"model": {"compiled": False}, "cuda": False}, {"launch"}, "default"),
    ({"model": {"compiled": False}, "cuda": True}, {"launch"}, "reduce-overhead"),
    ({"model": {"compiled": False}, "cuda": True}, {"compute"}, None),  # left to the search
    ({"model": {"compiled": True}, "cuda": True}, {"launch"}, None),
    ({"model": {"compiled": False}, "compiler": {"unavailable": "no C++ compiler"}}, {"launch"}, None),
])
def test_the_guess_compiles_a_launch_bound_model(facts, bottlenecks, expected):
    put = {}
    CompileGroup().guess("launch-bound", frozenset(bottlenecks), run_facts(facts), {}, 2, {}, put.__setitem__)
    assert put.get("compile") == expected


def test_the_search_names_the_modes_that_cannot_apply():
    cpu = CompileGroup().search(run_facts({"model": {"compiled": False}, "cuda": False}), 2)
    assert cpu.knobs[0].distribution.choices == ("off", "default")
    assert cpu.excluded["compile=reduce-overhead"] == "CUDA graphs need a GPU"
    gpu = CompileGroup().search(run_facts({"model": {"compiled": False}, "cuda": True}), 8)
    assert "reduce-overhead" in gpu.knobs[0].distribution.choices
    no_cxx = CompileGroup().search(run_facts({"model": {"compiled": False}, "compiler": {"unavailable": "no C++ compiler"}}), 2)
    assert no_cxx.excluded == {"compile": "no C++ compiler"}


@pytest.mark.slow
def test_a_model_compiled_at_launch_trains_as_the_eager_one_and_its_compile_time_is_read():
    def train(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(7)
        for _ in range(3):
            x = torch.randn(16, 8, generator=g)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            opt.step()
        return model

    eager = train(mlp())
    before = compiling.compile_seconds() or 0.0
    with patched({"compile": "default"}) as report:
        compiled = train(mlp())
    assert report.applied["compile"].startswith("forward of Sequential compiled with torch.compile")
    assert getattr(compiled, compiling.COMPILED_ATTR) == "default"
    assert (compiling.compile_seconds() or 0.0) > before  # dynamo's timer saw the compile
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # fused kernels: another order of operations
