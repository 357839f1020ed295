"""The precision group: AMP (O1 autocast, O2 half weights with fp32 masters), TF32, cuDNN autotuning.

These knobs make the math itself cheaper (the ``compute`` share of a step); cuDNN autotuning also
cuts the per-shape algorithm search of a launch-bound run.
"""

from __future__ import annotations

from perfscope.record.run_facts import RunFacts
from perfscope.runtime.groups.base import KnobGroup, Knob, SearchPart, categorical

COMPUTE = ("compute",)
TF32_MIN_CAPABILITY = 8  # TF32 tensor cores arrived with Ampere (compute capability 8.0)


def launch_amp(config) -> bool:
    """Whether ``config``'s mixed precision is applied at launch: bf16 O1 only
    (:mod:`perfscope.runtime.launch_amp` says why fp16 and O2 need the training loop)."""
    return config.amp_level == "O1" and config.amp_dtype == "bf16"


class PrecisionGroup(KnobGroup):
    """``amp_level``, ``amp_dtype``, ``tf32``, ``cudnn_benchmark``."""

    name = "precision"
    keys = ("amp_level", "amp_dtype", "tf32", "cudnn_benchmark")
    title = "AMP, TF32, cuDNN benchmark"

    # --- perfscope.accelerate -----------------------------------------------------------------

    def apply(self, acc) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        from perfscope.runtime import precision
        from perfscope.runtime.config import ConfigError

        cfg = acc.config
        for key, what in precision.set_backend_flags(cfg.tf32, cfg.cudnn_benchmark).items():
            acc.applied[key] = what if torch.cuda.is_available() else f"{what} (no effect: no CUDA device)"
        dtype_set = "amp_dtype" in self.changed(cfg)
        if cfg.amp_level == "O0":
            if dtype_set:
                acc.skipped["amp_dtype"] = "amp_level is O0: no mixed precision to run in it"
            return
        if dtype_set:
            acc.applied["amp_dtype"] = f"{cfg.amp_dtype} (see amp_level)"
        cuda = acc.device.type == "cuda"
        if cuda and cfg.amp_dtype == "bf16" and not torch.cuda.is_bf16_supported():
            raise ConfigError(f"config key 'amp_dtype': 'bf16' is not supported on {acc.device} "
                              f"({torch.cuda.get_device_name(acc.device)}); allowed here: fp16")
        if cfg.amp_dtype == "fp16":
            acc.scaler = torch.amp.GradScaler(acc.device.type)
        scaling = ", GradScaler loss scaling" if acc.scaler is not None else ""
        if cfg.amp_level == "O1":
            acc.applied["amp_level"] = f"O1: forward under torch.autocast('{acc.device.type}', {acc.amp_dtype}){scaling}"
            return
        if acc.optimizer is None:
            raise ConfigError("config key 'amp_level': 'O2' keeps fp32 master weights in the optimizer; "
                              "pass the optimizer to accelerate(), or use amp_level O0 or O1")
        if isinstance(acc.model, DistributedDataParallel):
            raise ConfigError("config key 'amp_level': 'O2' converts the model before DistributedDataParallel wraps it; "
                              "pass the unwrapped module (accelerate wraps it), or use amp_level O0 or O1")
        acc.masters = precision.MasterWeights(acc.optimizer, acc.model, acc.amp_dtype)
        acc.masters.convert_model()
        acc.applied["amp_level"] = (f"O2: {len(acc.masters.pairs)} weights in {acc.amp_dtype}, fp32 master weights in "
                                    f"the optimizer, norm layers fp32{scaling}")

    # --- launch-time patching -----------------------------------------------------------------

    def launch_plan(self, config, report) -> None:
        from perfscope.runtime.patch_report import NEEDS_ACCELERATE

        if config.tf32 is not None:
            report.applied["tf32"] = f"torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = {config.tf32}"
        if config.cudnn_benchmark is not None:
            report.applied["cudnn_benchmark"] = f"torch.backends.cudnn.benchmark = {config.cudnn_benchmark}"
        if launch_amp(config):
            from perfscope.runtime.launch_amp import WHAT

            report.applied["amp_level"] = WHAT
        elif config.amp_level != "O0":  # fp16 scaling, O2 master weights: in the loop
            report.needs_accelerate["amp_level"] = NEEDS_ACCELERATE
            report.needs_accelerate["amp_dtype"] = NEEDS_ACCELERATE

    def launch_patches(self, config, report) -> list:
        patches = []
        if config.tf32 is not None or config.cudnn_benchmark is not None:
            from perfscope.runtime.precision import backend_flags  # imports torch

            patches.append(backend_flags(config.tf32, config.cudnn_benchmark))
        if launch_amp(config):
            from perfscope.runtime.launch_amp import launch_autocast  # imports torch

            patches.append(launch_autocast())
        return patches

    # --- the tuner ----------------------------------------------------------------------------

    def observed(self, facts: RunFacts) -> dict:
        # A script that runs its own autocast is not seen: its baseline counts as fp32 (O0).
        return {"amp_level": "O0", "amp_dtype": "bf16", "tf32": facts.tf32, "cudnn_benchmark": facts.cudnn_benchmark}

    def search(self, facts: RunFacts, cpu: int) -> SearchPart:
        part = SearchPart()
        seen = self.observed(facts)
        cuda = facts.cuda
        if not (facts.accelerate.called and facts.accelerate.optimizer):
            # At launch only bf16 O1: fp16 scaling and O2 master weights live in the training loop.
            if cuda and not facts.bf16_supported:
                part.exclude("amp_level", "this GPU has no bf16, and fp16 needs loss scaling: "
                                          "perfscope.accelerate(model, optimizer, ...) in the script")
            else:
                part.knobs.append(Knob("amp_level", COMPUTE, categorical(["O0", "O1"]), seen["amp_level"]))
                part.exclude("amp_level=O2", "fp32 master weights in the optimizer need perfscope.accelerate in the script")
            part.exclude("amp_dtype", "bf16 at launch; fp16 needs loss scaling around backward: "
                                      "perfscope.accelerate in the script")
        else:
            levels = ["O0", "O1", "O2"] if cuda else ["O0", "O1"]
            part.knobs.append(Knob("amp_level", COMPUTE, categorical(levels), seen["amp_level"]))
            if not cuda:
                part.exclude("amp_level=O2", "no GPU: half-precision weights with fp32 masters only pay off on a GPU")
            dtypes = ["bf16", "fp16"] if cuda and facts.bf16_supported else (["fp16"] if cuda else ["bf16"])
            if len(dtypes) > 1:
                part.knobs.append(Knob("amp_dtype", COMPUTE, categorical(dtypes), seen["amp_dtype"],
                                       when=("amp_level", ("O1", "O2"))))
            else:
                part.exclude("amp_dtype", f"only {dtypes[0]} is available here")
        if not cuda:
            part.exclude(("tf32", "cudnn_benchmark"), "no GPU")
            return part
        capability = facts.cuda_capability or [0, 0]
        if capability[0] >= TF32_MIN_CAPABILITY:
            part.knobs.append(Knob("tf32", COMPUTE, categorical([False, True]), seen["tf32"]))
        else:
            part.exclude("tf32", "the GPU has no TF32 (needs compute capability 8.0 or newer)")
        part.knobs.append(Knob("cudnn_benchmark", ("compute", "launch"), categorical([False, True]),
                               seen["cudnn_benchmark"]))
        return part

    def guess(self, verdict, bottlenecks, facts, fractions, cpu, params, put) -> None:
        """compute: mixed precision, TF32 and cuDNN autotuning; launch: cuDNN autotuning
        (PyTorch's performance tuning guide)."""
        if "compute" in bottlenecks:
            put("amp_level", "O1")
            put("amp_dtype", "bf16")
            put("tf32", True)
            put("cudnn_benchmark", True)
        elif "launch" in bottlenecks:
            put("cudnn_benchmark", True)
