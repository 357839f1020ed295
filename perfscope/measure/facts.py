"""Facts ``perfscope.measure`` records about a run: batch sizes, DataLoader settings,
backend flags and the process group."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

import torch

# Searching a batch for its first tensor: a long list of strings must not be scanned every fetch.
_MAX_ITEMS, _MAX_DEPTH = 256, 8


def batch_size(batch: Any, depth: int = 0) -> int | None:
    """Leading dimension of the first tensor in ``batch`` (depth first), or None when none is found.

    Looks into tuples, lists (named tuples too) and mappings; a 0-d tensor has no batch dimension
    and is passed over.
    """
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if depth >= _MAX_DEPTH:
        return None
    if isinstance(batch, Mapping):
        batch = batch.values()
    elif not isinstance(batch, (list, tuple)):
        return None
    for _, item in zip(range(_MAX_ITEMS), batch):
        size = batch_size(item, depth + 1)
        if size is not None:
            return size
    return None


def loader_settings(loader: Any) -> dict:
    """The settings of a DataLoader the tuner looks at (getattr: a subclass may lack some)."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    return {
        "num_workers": workers,
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "prefetch_factor": getattr(loader, "prefetch_factor", None) if workers > 0 else None,
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "iterable": isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset),
        "batch_size": getattr(loader, "batch_size", None),
    }


def backend_flags() -> dict:
    """TF32 for fp32 matmuls, cuDNN benchmark and the intra-op threads, as set now; the host's
    1-minute load average (None where unknown)."""
    try:
        tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
    except Exception:  # noqa: BLE001 - set through the newer fp32_precision API, which refuses the old read
        tf32 = getattr(torch.backends.cuda.matmul, "fp32_precision", None) == "tf32"
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"tf32": tf32, "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "intra_op_threads": int(torch.get_num_threads()), "load_1m": load}


def host_threads(flags: dict, loader: dict | None, cores: int) -> dict:
    """What competed for the cores during the run: the training process's intra-op threads and
    its DataLoader's worker processes (one thread each), against the cores this process may use,
    and the host's load average when the first step began (other work on the machine)."""
    intra = flags.get("intra_op_threads")
    workers = int((loader or {}).get("num_workers") or 0)
    return {"intra_op_threads": intra, "loader_workers": workers, "cores": cores,
            "demand": (intra or 1) + workers, "load_1m": flags.get("load_1m")}


def dist_snapshot() -> dict | None:
    """World size and backend of the default process group, or None when there is none."""
    dist = torch.distributed
    with contextlib.suppress(Exception):  # a group being torn down
        if dist.is_available() and dist.is_initialized():
            return {"world_size": dist.get_world_size(), "backend": str(dist.get_backend())}
    return None


MAX_MODULE_NAMES = 64  # a Swin-B has 24 window attentions; a fact, not a dump of the model


def fsdp_version(model: Any) -> int | None:
    """2 where the model is sharded with FSDP2 (``fully_shard`` makes it an ``FSDPModule``), 1 where it
    is a ``FullyShardedDataParallel``, else None."""
    import torch

    if not torch.distributed.is_available():
        return None
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # a torch without FSDP2
        return None
    if isinstance(model, FSDPModule):
        return 2
    return 1 if isinstance(model, FullyShardedDataParallel) else None


def model_facts(model: Any) -> dict:
    """What the tuner needs of the script's model: its class, whether it is ``compiled`` (the
    script's own ``torch.compile``), its FSDP version (``fsdp``: 2, 1 or None), its 2-D ``convolutions`` (a count)
    and whether they are ``channels_last`` already, and the window-attention modules
    ``fused_ops.swap`` would replace (``fusable``, qualified names) or leaves alone with why
    (``not_fusable``: name -> reason)."""
    from perfscope.fused_ops.swap import find
    from perfscope.runtime.compiling import is_compiled
    from perfscope.runtime.memory_format import convolutions, is_channels_last

    found = find(model)
    return {"class": type(model).__name__, "compiled": is_compiled(model), "fsdp": fsdp_version(model),
            "convolutions": len(convolutions(model)),
            "channels_last": is_channels_last(model),
            "fusable": [c.name for c in found if c.reason is None][:MAX_MODULE_NAMES],
            "not_fusable": dict([(c.name, c.reason) for c in found if c.reason is not None][:MAX_MODULE_NAMES])}


def run_facts(torch, recorder) -> dict:
    """What the tuner shapes its search space from (see ``measure.measure_in_process``); taken at
    the run's end, so ``compiler.compile_s`` holds every compile of the run (seconds)."""
    from perfscope.runtime.compiling import compile_seconds, unavailable

    cuda = bool(torch.cuda.is_available())
    gpu_name = capability = None
    bf16 = False
    if cuda:
        with contextlib.suppress(Exception):  # a device the script left in an error state
            device = torch.cuda.current_device()  # the script's (set_device(local_rank))
            gpu_name = torch.cuda.get_device_name(device)
            capability = list(torch.cuda.get_device_capability(device))
            bf16 = bool(torch.cuda.is_bf16_supported())
    dist = recorder.dist or {}
    env_world = _env_int("WORLD_SIZE")
    world_size = dist.get("world_size") or env_world or 1
    local_world_size = _env_int("LOCAL_WORLD_SIZE") or world_size
    flags = recorder.first_step or {}
    return {
        "torch": str(torch.__version__),
        "cuda": cuda,
        "gpu_name": gpu_name,
        "cuda_capability": capability,
        "bf16_supported": bf16,
        "cpu_count": _cpu_count(),
        "world_size": int(world_size),
        "local_world_size": int(local_world_size),
        "dist_backend": dist.get("backend") or recorder.ddp_backend,
        "ddp": recorder.ddp,
        "dataloader": recorder.loader,
        "accelerate": dict(recorder.accelerate),
        "model": recorder.model,
        "optimizer": recorder.optimizer,
        "tf32": bool(flags.get("tf32", False)),
        "cudnn_benchmark": bool(flags.get("cudnn_benchmark", False)),
        "threads": host_threads(flags, recorder.loader, _cpu_count()),
        "compiler": {"unavailable": unavailable(cuda), "compile_s": compile_seconds()},
    }


def _cpu_count() -> int:
    # The cores this process may run on (a container's or taskset's share), not the machine's.
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _env_int(name: str) -> int | None:
    try:
        value = int(os.environ[name])
    except (KeyError, ValueError):
        return None
    return value if value > 0 else None
