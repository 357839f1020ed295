"""GPU efficiency from the kernels' launch figures and names (``details.gpu_efficiency``), worked out
by hand on small traces, and checked on real ones."""

from __future__ import annotations

import pytest
from tracegen import launch, step, write_trace

import perfscope
from perfscope.analysis.gpu_efficiency import tensor_core_names

V100 = {"id": 0, "name": "Tesla V100-SXM2-16GB", "computeMajor": 7, "computeMinor": 0, "warpSize": 32}
A100 = {"id": 0, "name": "NVIDIA A100-SXM4-40GB", "computeMajor": 8, "computeMinor": 0, "warpSize": 32}
MI250 = {"id": 0, "name": "AMD Radeon Graphics", "computeMajor": 9, "computeMinor": 0, "warpSize": 64}


def _kernel(name, launch_ts, ts, dur, corr, blocks=None, occupancy=None):
    call, k = launch(name, launch_ts, ts, dur, corr)
    if blocks is not None:
        k["args"].update({"blocks per SM": blocks, "est. achieved occupancy %": occupancy})
    return [call, k]


def _analyze(tmp_path, kernels, device):
    # one step, [1000, 2000) µs; its kernels end by 1800, so its window is the step's 1000 µs
    events = [step(1, 1000, 1000), *[e for k in kernels for e in k]]
    return perfscope.analyze(write_trace(tmp_path / "t.json", events, deviceProperties=[device]))


def test_sm_efficiency_occupancy_and_tensor_core_share_by_hand(tmp_path):
    a = _analyze(tmp_path, [_kernel("ampere_sgemm_128x64_nn", 1010, 1100, 400, 1, 0.5, 25),
                            _kernel("cutlass_80_tensorop_s1688gemm_64x64_32x6_tn", 1020, 1600, 200, 2, 2.0, 50)], A100)
    e = a.details.gpu_efficiency
    assert e.kernel_us == 600 and e.window_us == 1000
    assert e.sm_efficiency == pytest.approx((400 * 0.5 + 200 * 1.0) / 1000)  # blocks per SM capped at 1
    assert e.achieved_occupancy == pytest.approx((400 * 0.25 + 200 * 0.50) / 600)
    assert e.tensor_core_share == pytest.approx(200 / 600) and e.tensor_core_kernels == 1
    assert e.figured_share == 1.0 and e.capability == 8.0 and e.no_tensor_cores is False
    assert a.details.facts.no_tensor_cores is None
    assert not a.details.advice.compute.startswith("No kernel ran on Tensor Cores")


def test_a_volta_run_without_tensor_core_kernels_is_told_so(tmp_path):
    a = _analyze(tmp_path, [_kernel("volta_sgemm_64x64_nt", 1010, 1100, 700, 1, 1.5, 40),
                            _kernel("void at::native::vectorized_elementwise_kernel<4>", 1020, 1800, 100, 2)], V100)
    e = a.details.gpu_efficiency
    assert e.tensor_core_share == 0 and e.no_tensor_cores is True and e.capability == 7.0
    assert e.figured_share == pytest.approx(700 / 800)  # the second kernel has no launch figures
    assert e.achieved_occupancy == pytest.approx(0.40)  # over the kernels that have them
    assert e.sm_efficiency == pytest.approx(700 / 1000)
    assert a.details.facts.no_tensor_cores == 7.0
    assert a.details.advice.compute.startswith("No kernel ran on Tensor Cores, though this GPU has them "
                                                     "(compute capability 7.0)")


def test_rocm_devices_are_not_judged_by_cuda_capability(tmp_path):
    a = _analyze(tmp_path, [_kernel("Cijk_Ailk_Bljk_SB_MT64x64", 1010, 1100, 400, 1)], MI250)
    e = a.details.gpu_efficiency
    assert e.capability is None and e.no_tensor_cores is False and e.sm_efficiency is None
    assert a.details.facts.no_tensor_cores is None


@pytest.mark.parametrize("name, tensor_cores", [
    ("volta_h884gemm_64x64_ldg8_nn", True), ("turing_fp16_s1688gemm_fp16_128x128_ldg8_f2f_nn", True),
    ("ampere_fp16_s16816gemm_fp16_128x64_ldg8_f2f_stages_32x6_nn", True), ("sm90_xmma_gemm_bf16bf16_bf16f32", True),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", True), ("cutlass_80_tensorop_s1688gemm", True),
    ("volta_sgemm_128x64_nn", False), ("volta_scudnn_128x64_relu_medium_nn_v1", False),
    ("void at::native::vectorized_elementwise_kernel<4>", False), ("ncclKernel_AllReduce_RING_LL_Sum_float", False),
])
def test_tensor_core_kernels_by_name(name, tensor_cores):
    import numpy as np

    assert tensor_core_names(np.array([name], dtype=object)).tolist() == [tensor_cores]


def test_real_traces(shared_traces):
    v100 = perfscope.analyze(shared_traces / "tb_plugin" / "resnet50_num_workers_4" / "worker0.1623212756351.pt.trace.json.gz")
    e = v100.details.gpu_efficiency
    # fp32 ResNet-50 on a V100: cuDNN's and cuBLAS's fp32 kernels only
    assert e.no_tensor_cores is True and e.figured_share == 1.0
    assert 0 < e.sm_efficiency <= 1 and 0 < e.achieved_occupancy <= 1
    a100 = perfscope.analyze(shared_traces / "hta" / "a100_rank3_of8_train.json.gz")
    e = a100.details.gpu_efficiency
    assert e.capability == 8.0 and e.tensor_core_kernels > 0 and 0 < e.tensor_core_share < 1
    assert e.no_tensor_cores is False
