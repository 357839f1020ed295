"""Data parallel: wrap a model in DistributedDataParallel with the configured knobs.

``wrap_ddp`` applies ``bucket_cap_mb``, ``static_graph``, ``gradient_as_bucket_view`` and a
communication hook: PyTorch's own fp16/bf16 compression hooks, or the hierarchical all-reduce
of :mod:`perfscope.runtime.hierarchical` (which, combined with compression, communicates the
compressed bucket hierarchically). ``sync_context`` skips gradient synchronisation on all but
the last micro-step of an accumulation window.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook, fp16_compress_hook
from torch.nn.parallel import DistributedDataParallel

from perfscope.runtime.config import GRAD_COMPRESSIONS
from perfscope.runtime.hierarchical import HierarchicalAllReduce, hierarchical_allreduce_hook

_COMPRESS_HOOKS = {"fp16": fp16_compress_hook, "bf16": bf16_compress_hook}
_COMPRESS_DTYPES = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
_MIB = 1024 * 1024


def wrap_ddp(
    model: torch.nn.Module,
    *,
    bucket_cap_mb: float,
    static_graph: bool,
    gradient_as_bucket_view: bool = True,
    grad_compression: str = "none",
    hierarchical_allreduce: bool = False,
    local_world_size: int | None = None,
    device_ids: list[int] | None = None,
) -> DistributedDataParallel:
    """Wraps ``model`` in DistributedDataParallel over the default process group.

    This is a collective call: every rank must make it, with the same arguments.

    Args:
        model: The module to wrap (not already a DistributedDataParallel).
        bucket_cap_mb: Gradient bucket size limit in MiB (> 0; fractions allowed).
        static_graph: Tell DDP the set of used parameters does not change between iterations.
        gradient_as_bucket_view: Make ``.grad`` views into the buckets (saves a copy and memory).
        grad_compression: ``"none"``, ``"fp16"`` or ``"bf16"``: communicate gradients in that
            precision (PyTorch's ``fp16_compress_hook`` / ``bf16_compress_hook``; on gloo the
            latter through :func:`gloo_bf16_compress_hook`).
        hierarchical_allreduce: Reduce within each node first, then across nodes
            (:func:`~perfscope.runtime.hierarchical.hierarchical_allreduce_hook`); with
            compression, the compressed bucket is what travels through every stage.
        local_world_size: Ranks per node for the hierarchical all-reduce; ``None`` reads
            ``$LOCAL_WORLD_SIZE``. Ignored without ``hierarchical_allreduce``.
        device_ids: Passed to DDP (``[local_rank]`` for one GPU per process; ``None`` on CPU).

    Returns:
        The DistributedDataParallel module.

    Raises:
        ValueError: ``model`` is already DistributedDataParallel, ``bucket_cap_mb`` is not
            positive, ``grad_compression`` is not one of the allowed values, or the node layout
            is invalid (see :class:`~perfscope.runtime.hierarchical.HierarchicalAllReduce`).
        RuntimeError: No default process group is initialised.
    """
    if isinstance(model, DistributedDataParallel):
        raise ValueError("the model is already wrapped in DistributedDataParallel; wrap it once")
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) or not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be a positive number of MiB, got {bucket_cap_mb!r}")
    if grad_compression not in GRAD_COMPRESSIONS:
        raise ValueError(
            f"grad_compression must be one of {', '.join(GRAD_COMPRESSIONS)}; got {grad_compression!r}"
        )
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "wrap_ddp needs an initialised default process group "
            "(torch.distributed.init_process_group); check torch.distributed.is_initialized() first"
        )
    # The hook state creates process groups (a collective); doing it before DDP means a bad
    # layout fails on every rank before DDP's own broadcast of the parameters.
    hook = comm_hook(grad_compression, hierarchical_allreduce, local_world_size)
    ddp = DistributedDataParallel(
        model,
        device_ids=device_ids,
        bucket_cap_mb=bucket_cap_mb,
        static_graph=static_graph,
        gradient_as_bucket_view=gradient_as_bucket_view,
    )
    if hook is not None:
        ddp.register_comm_hook(*hook)
    return ddp


def comm_hook(grad_compression: str, hierarchical_allreduce: bool, local_world_size: int | None = None):
    """The ``(state, hook)`` pair to pass to ``DistributedDataParallel.register_comm_hook``, or None.

    Shared by :func:`wrap_ddp` and the launch-time patching, so both register the same hooks.

    Args:
        grad_compression: ``"none"``, ``"fp16"`` or ``"bf16"``.
        hierarchical_allreduce: Use the hierarchical hook (compressing inside it, if asked).
        local_world_size: Ranks per node; ``None`` reads ``$LOCAL_WORLD_SIZE`` (torchrun sets it),
            and without it all ranks are taken to share one node.

    Raises:
        ValueError: an invalid node layout (see :class:`~perfscope.runtime.hierarchical.HierarchicalAllReduce`).
    """
    if hierarchical_allreduce:
        if local_world_size is None and not os.environ.get("LOCAL_WORLD_SIZE"):
            local_world_size = dist.get_world_size()
        state = HierarchicalAllReduce(local_world_size, compress_dtype=_COMPRESS_DTYPES[grad_compression])
        return state, hierarchical_allreduce_hook
    if grad_compression == "none":
        return None
    hook = _COMPRESS_HOOKS[grad_compression]
    if grad_compression == "bf16" and dist.get_backend() == "gloo":
        hook = gloo_bf16_compress_hook
    return None, hook  # None: the world group


def gloo_bf16_compress_hook(process_group, bucket):
    """PyTorch's ``bf16_compress_hook``, under a name DDP accepts on gloo.

    DDP refuses a hook *named* ``bf16_compress_hook`` unless CUDA with NCCL >= 2.10 is present,
    a check meant for NCCL; gloo reduces bfloat16 tensors fine. (Unannotated on purpose: DDP
    rejects string annotations, and this module uses postponed evaluation.)
    """
    return bf16_compress_hook(process_group, bucket)


def bucket_cap_mb_of(ddp: DistributedDataParallel) -> float:
    """The bucket size limit the reducer was built with, in MiB.

    Reads ``bucket_cap_bytes`` from DDP's logging data (filled in by the C++ reducer's logger),
    falling back to the ``bucket_bytes_cap`` attribute on versions without it. DDP truncates the
    limit to whole bytes, so a fractional MiB value reads back to within one byte.

    Args:
        ddp: A DistributedDataParallel module.

    Returns:
        The limit in MiB.

    Raises:
        TypeError: ``ddp`` is not DistributedDataParallel.
    """
    if not isinstance(ddp, DistributedDataParallel):
        raise TypeError(f"expected a DistributedDataParallel module, got {type(ddp).__name__}")
    try:
        cap_bytes = ddp._get_ddp_logging_data()["bucket_cap_bytes"]
    except (AttributeError, KeyError, RuntimeError):
        cap_bytes = ddp.bucket_bytes_cap
    return int(cap_bytes) / _MIB


def sync_context(
    model: torch.nn.Module, micro_step: int, accum_steps: int
) -> contextlib.AbstractContextManager:
    """The context to run a micro-step's forward and backward in, for gradient accumulation.

    ``ddp.no_sync()`` on all but the last micro-step of each window of ``accum_steps``, so
    gradients accumulate locally and are all-reduced once per window; a null context on the
    last micro-step, when ``accum_steps == 1``, and for models that are not DDP.

    One exception, for ``static_graph=True``: DDP (through torch 2.13 at least; pytorch/pytorch
    issue 143580, PR 187732) fails an internal assert when a static-graph model's first backward
    runs under ``no_sync``. Until DDP has run one synchronised backward, this therefore returns a
    null context. The window's gradient is unchanged, since all-reducing a micro-step's gradient
    that is already the world average leaves it as it is; the cost is one extra all-reduce, once.

    Args:
        model: The (possibly DDP-wrapped) model.
        micro_step: 0-based micro-step counter; either the index inside the window or a running
            count since training began (the window ends when ``(micro_step + 1) % accum_steps == 0``).
        accum_steps: Micro-steps per optimizer step (>= 1).

    Returns:
        A context manager.

    Raises:
        ValueError: ``accum_steps < 1`` or ``micro_step < 0``.
    """
    if accum_steps < 1:
        raise ValueError(f"grad_accum_steps must be >= 1, got {accum_steps}")
    if micro_step < 0:
        raise ValueError(f"micro_step must be >= 0, got {micro_step}")
    last = (micro_step + 1) % accum_steps == 0
    if last or not isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext()
    # DDP sets this private flag in the first backward of a static graph; without it (another
    # torch version), no_sync is used as usual.
    if model.static_graph and not getattr(model, "_static_graph_delay_allreduce_enqueued", True):
        return contextlib.nullcontext()
    return model.no_sync()
