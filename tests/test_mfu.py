"""Model FLOPs utilisation: FLOPs from shapes and from perfscope's own count, the peaks, the view."""

from __future__ import annotations

import gzip
import json

import msgspec
import pandas as pd
import pytest

from perfscope.analysis.mfu import (
    cpu_flops_per_cycle, cpu_peak, flops_from_shapes, gpu_peak, math_of_kernels, mfu_line, shape_flops,
)
from perfscope.collect.flops import cpu_facts, target_step
from perfscope.record.schema import Mfu
from perfscope.record.step_flops import FLOPS_KEY, CpuFacts, parse


def test_formulas_count_matrix_products_and_convolutions_from_their_backward():
    assert shape_flops("aten::mm", "[[4,8],[8,16]]") == 2 * 4 * 8 * 16
    assert shape_flops("aten::addmm", "[[16],[4,8],[8,16],[],[]]") == 2 * 4 * 8 * 16
    assert shape_flops("aten::bmm", "[[3,4,8],[3,8,5]]") == 2 * 3 * 4 * 8 * 5
    # grad_output [N, Cout, Ho, Wo], weight [Cout, Cin, kh, kw]: forward and both gradients
    conv = 3 * 2 * (32 * 64 * 56 * 56) * (64 * 3 * 3)
    assert shape_flops("aten::convolution_backward", "[[32,64,56,56],[32,64,56,56],[64,64,3,3],[],[]]") == conv
    assert shape_flops("aten::cudnn_convolution_backward", "[[32,64,56,56],[32,64,56,56],[64,64,3,3],[]]") == conv
    assert shape_flops("aten::mm", "[[4,8]]") is None and shape_flops("aten::relu", "[[4]]") is None


def _ops(rows):
    return pd.DataFrame(rows, columns=["step", "name", "shape", "calls"])


def test_shapes_give_flops_per_step_but_not_for_forward_only_convolutions():
    ops = _ops([(1, "aten::mm", "[[4,8],[8,16]]", 2), (2, "aten::mm", "[[4,8],[8,16]]", 2),
                (1, "aten::linear", "[[4,8],[16,8],[16]]", 2), (2, "aten::relu", "[[4,16]]", 1)])
    per_step, by_op = flops_from_shapes(ops)
    assert per_step == 2 * 4 * 8 * 16 * 2 and by_op == {"aten::mm": per_step}  # linear is not counted again
    inference = _ops([(1, "aten::convolution", "[[1,3,8,8],[4,3,3,3]]", 1), (1, "aten::mm", "[[4,8],[8,16]]", 1)])
    assert flops_from_shapes(inference) is None  # most FLOPs in convolutions whose output size is unknown
    assert flops_from_shapes(_ops([(1, "aten::relu", "[[4]]", 3)])) is None


def test_peaks_by_device_name_and_math():
    assert gpu_peak("NVIDIA A100-SXM4-80GB", "bf16") == (312.0, "bf16")
    assert gpu_peak("NVIDIA A100-PG509-200", "tf32") == (156.0, "tf32")
    assert gpu_peak("NVIDIA H100 PCIe", "bf16") == (756.0, "bf16")
    assert gpu_peak("NVIDIA H100 80GB HBM3", "bf16") == (989.4, "bf16")
    assert gpu_peak("NVIDIA A10", "fp32") == (31.2, "fp32")
    assert gpu_peak("Tesla V100-DGXS-32GB", "tf32") == (15.7, "fp32")  # no TF32 before Ampere
    assert gpu_peak("Some Future GPU", "fp32") is None and gpu_peak(None, "fp32") is None


def test_cpu_rate_from_vector_flags():
    assert cpu_flops_per_cycle(["fma", "avx2", "avx512f"], "GenuineIntel", "fp32")[0] == 64
    assert cpu_flops_per_cycle(["fma", "avx2", "avx512f"], "AuthenticAMD", "fp32")[0] == 32  # Zen 4
    assert cpu_flops_per_cycle(["fma", "avx2"], "GenuineIntel", "fp32")[0] == 32
    assert cpu_flops_per_cycle(["fma", "avx2", "avx512f", "avx512_bf16"], "GenuineIntel", "bf16")[0] == 128
    assert cpu_flops_per_cycle(["avx512f", "amx_bf16"], "GenuineIntel", "bf16")[0] == 1024
    assert cpu_flops_per_cycle(["asimd"], None, "fp64")[0] == 8
    tflops, notes = cpu_peak(CpuFacts(cores=4, ghz=2.5, ghz_source="cpu MHz", flags=["fma", "avx2"]), "fp32")
    assert tflops == pytest.approx(4 * 2.5e9 * 32 / 1e12) and "4 physical core(s) x 2.50 GHz" in notes[0]
    assert cpu_peak(CpuFacts(), "fp32") is None


def test_cpu_facts_read_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    blocks = [f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Test CPU\nphysical id\t: 0\n"
              f"core id\t\t: {i // 2}\ncpu MHz\t\t: 3000.000\nflags\t\t: fpu sse fma avx2 avx512f amx_bf16\n"
              for i in range(4)]  # two cores with two threads each
    info.write_text("\n".join(blocks))
    facts = cpu_facts(str(info), str(tmp_path / "nosys"))
    allowed = __import__("os").sched_getaffinity(0)
    assert facts.model == "Test CPU" and facts.vendor == "GenuineIntel" and facts.ghz == 3.0
    assert facts.cores == len({i // 2 for i in range(4) if i in allowed})
    assert facts.flags == ["fma", "avx2", "avx512f", "amx_bf16"] and facts.ghz_source == "cpu MHz"
    assert target_step(3) == 2 and target_step(1) == 1 and target_step(0) is None


def test_kernel_names_tell_the_math():
    assert math_of_kernels(["ampere_bf16_s16816gemm_bf16_128x64", "elementwise_kernel"], [5.0, 50.0]) == "bf16"
    assert math_of_kernels(["volta_sgemm_128x64_nn", "sm80_xmma_gemm_f32f32_tf32f32"], [1.0, 3.0]) == "tf32"
    assert math_of_kernels(["volta_sgemm_128x64_nn"], [1.0]) == "fp32"
    assert math_of_kernels(["vectorized_elementwise_kernel"], [1.0]) is None


def test_a_record_that_is_not_perfscopes_is_refused():
    assert parse({"version": 1, "flops": -5})[0] is None
    assert parse("x")[0] is None
    ok, problems = parse({"version": 1, "step": 2, "flops": 10.0, "by_dtype": {"torch.float32": 10.0}})
    assert ok.flops == 10.0 and problems == []


# ----------------------------------------------------------------------------- real traces

def test_resnet50_trace_gives_the_known_flops_per_step(shared_traces):
    """ResNet-50 does 4.09 GMACs per 224x224 image forward (torchvision's model card); a training
    step of batch 32 does three times the forward's 2 x 4.09 GFLOP per image."""
    import perfscope

    a = perfscope.analyze(shared_traces / "tb_plugin" / "resnet50_num_workers_0")
    view = a.summary()["details"]["mfu"]
    assert view["source"] == "shapes" and view["device"] == "Tesla V100-DGXS-32GB"
    assert view["flops_per_step"] == pytest.approx(3 * 2 * 4.09e9 * 32, rel=0.01)
    assert view["math"] == "fp32" and view["peak_tflops"] == 15.7
    assert view["mfu"] == pytest.approx(view["flops_per_step"] / view["step_time_s"] / 15.7e12)
    assert 0.05 < view["mfu"] < 0.9
    assert mfu_line(msgspec.convert(view, Mfu)).startswith(f"{view['mfu']:.1%} of Tesla V100-DGXS-32GB's fp32 peak")


def test_a100_rank_is_placed_against_the_tf32_peak(shared_traces):
    import perfscope

    a = perfscope.analyze(shared_traces / "hta" / "a100_rank3_of8_train.json.gz")
    view = a.summary()["details"]["mfu"]
    assert view["math"] == "tf32" and view["peak_tflops"] == 156.0 and view["mfu"] is not None
    assert {o["name"] for o in view["top_operators"]} == {"aten::mm", "aten::addmm", "aten::bmm"}


# ----------------------------------------------------------------------------- perfscope profile

def test_profile_counts_one_start_up_step_and_the_cpu_run_gets_its_mfu(tmp_path):
    pytest.importorskip("torch")
    from collectkit import SMALL, loop_script

    import perfscope
    from perfscope.collect import collect

    result = collect(loop_script(tmp_path, iterations=12), [], out_dir=tmp_path / "out", schedule=SMALL)
    (trace,) = result.trace_files
    with gzip.open(trace, "rt") as f:
        record = json.load(f)[FLOPS_KEY]
    # Linear(8, 16), ReLU, Linear(16, 1) on batches of 4: forward 2*4*8*16 + 2*4*16*1; backward the
    # second layer's input and weight gradients and the first layer's weight gradient (its input
    # needs none)
    expected = (2 * 4 * 8 * 16 + 2 * 4 * 16) + (2 * 4 * 16 + 2 * 16 * 4) + 2 * 8 * 4 * 16
    assert record["step"] == 1 and record["flops"] == expected and record["skipped"] is None
    assert record["by_dtype"] == {"torch.float32": expected}
    view = perfscope.analyze(trace).summary()["details"]["mfu"]
    assert view["source"] == "counted" and view["counted_step"] == 1 and view["flops_per_step"] == expected
    if view["peak_tflops"] is not None:  # /proc/cpuinfo gave the cores and the clock
        assert any(a.startswith("CPU peak:") for a in view["assumptions"]) and view["mfu"] > 0


def test_a_script_that_compiled_its_model_since_the_run_began_is_not_counted(monkeypatch):
    pytest.importorskip("torch")
    from perfscope.collect import flops

    graphs = iter([3, 4])  # 3 compiled before the run (another user of the process), 1 by the script
    monkeypatch.setattr(flops, "_compiled_graphs", lambda: next(graphs))
    counter = flops.FlopStep(target=2)
    counter.boundary(1)
    counter.boundary(2)
    assert not counter.active and counter.record.skipped.startswith("the script compiles its model")
    assert counter.header()[0] == FLOPS_KEY
