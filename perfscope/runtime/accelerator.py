"""``accelerate(model, optimizer, loader, config=...)``: apply a configuration to a training loop.

The loop changes by a few lines::

    model, optimizer, loader = perfscope.accelerate(model, optimizer, loader, config="tuned.yaml")
    for x, y in loader:
        optimizer.zero_grad()            # a no-op in the middle of an accumulation window
        with perfscope.autocast():       # autocast at O1, a no-op otherwise
            loss = loss_fn(model(x), y)
        perfscope.backward(loss)         # loss / k, fp16 loss scaling, no_sync on micro-steps
        optimizer.step()                 # really steps on every k-th call (unscale, skip on inf)

``docs/runtime.md`` documents every knob.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from perfscope import control
from perfscope.errors import PerfscopeError
from perfscope.runtime import patching, precision, threads
from perfscope.runtime.config import AccelConfig, ConfigError, load_config
from perfscope.runtime.data import ITERABLE_SKIP_REASON, DevicePrefetcher, iterable_without_sharding, rebuild_loader
from perfscope.runtime.optimizer import AcceleratedOptimizer

DDP_DEFAULT_BUCKET_MB = 25.0  # DistributedDataParallel's own default
# Every object accelerate() returned; weak, and not an attribute, so torch.save(model) stays clean.
_accelerated: weakref.WeakSet = weakref.WeakSet()

_active: Accelerator | None = None


class AlreadyAcceleratedError(PerfscopeError, ValueError):
    """``accelerate`` was given an object that an earlier ``accelerate`` call returned."""


class Accelerator:
    """What ``accelerate`` applied, and the per-step state AMP and accumulation need.

    Attributes:
        config: The applied configuration.
        device: The model's device (of its first parameter; CPU without parameters).
        applied: Knob -> what was done.
        skipped: Knob -> why it was not applied (e.g. ``"tf32": "no CUDA device"``).
        model, optimizer, loader: The objects returned to the caller.
        scaler: The ``torch.amp.GradScaler`` for fp16, else None.
        masters: The O2 :class:`~perfscope.runtime.precision.MasterWeights`, else None.
        accum_steps: Micro-batches per optimizer step.
        micro_step: 0-based index, in the current accumulation window, of the micro-step in
            progress (advanced by the returned optimizer's ``step()``).
        steps_skipped: Optimizer steps the fp16 GradScaler skipped (inf/nan gradients).
    """

    def __init__(self, config: AccelConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.applied: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.model = self.optimizer = self.loader = None
        self.scaler: torch.amp.GradScaler | None = None
        self.masters: precision.MasterWeights | None = None
        self.amp_dtype = precision.DTYPES[config.amp_dtype]
        self.accum_steps = 1
        self.micro_step = 0
        self.steps_skipped = 0

    def autocast(self):
        """The context to run the forward (and loss) in: ``torch.autocast`` at O1, else a no-op."""
        return precision.autocast_context(self.config.amp_level, self.device.type, self.amp_dtype)

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """``loss.backward()`` with the configured accumulation, loss scaling and DDP no_sync.

        The loss is divided by ``accum_steps`` (so the gradient of a window equals that of one
        mean-reduced loss over the k-times batch), scaled by the fp16 GradScaler, and, on all but
        the last micro-step of a window, back-propagated without DDP gradient synchronisation.

        Args:
            loss: A scalar loss.
            **kwargs: Passed on to ``Tensor.backward`` (e.g. ``retain_graph``).
        """
        control.note_loss(loss)  # the script's own loss: before the division and the scaling
        if self.accum_steps > 1:
            loss = loss / self.accum_steps
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        with self._sync_context():
            loss.backward(**kwargs)

    def _sync_context(self):
        from torch.nn.parallel import DistributedDataParallel

        if self.accum_steps == 1 or not isinstance(self.model, DistributedDataParallel):
            return _null()
        from perfscope.runtime.parallel import sync_context

        return sync_context(self.model, self.micro_step, self.accum_steps)

    def summary(self) -> str:
        """One line per applied and skipped knob."""
        lines = [f"applied {k}: {v}" for k, v in self.applied.items()]
        return "\n".join(lines + [f"skipped {k}: {v}" for k, v in self.skipped.items()])


def _null():
    import contextlib

    return contextlib.nullcontext()


def accelerate(model: nn.Module, optimizer: torch.optim.Optimizer | None = None, loader=None, *, config=None):
    """Apply an acceleration configuration to a model, its optimizer and its data loader.

    Args:
        model: The fp32 model, already on its device (not yet wrapped in DDP for O2).
        optimizer: Its optimizer, or None (then O2 and accumulation cannot apply).
        loader: Its DataLoader (or any iterable of batches), or None.
        config: A YAML path, dict or :class:`AccelConfig`; None reads ``$PERFSCOPE_CONFIG``,
            and without it the objects come back unchanged.

    Returns:
        ``(model, optimizer, loader)`` to use instead of the given ones; ``perfscope.accelerator()``
        returns the :class:`Accelerator` with what was applied and skipped.

    Raises:
        TypeError: ``model``, ``optimizer`` or ``loader`` is not of a type it can be (named).
        ConfigError: invalid configuration, or one this setup cannot honour (named key).
        AlreadyAcceleratedError: an object came from an earlier ``accelerate`` call.
    """
    global _active
    _check_types(model, optimizer, loader)
    control.note_accelerate(model, optimizer, loader)  # also when no config applies: a fact for the tuner
    cfg = load_config(config)
    if cfg is None:
        return model, optimizer, loader
    for name, obj in (("model", model), ("optimizer", optimizer), ("loader", loader)):
        if obj is not None and _is_accelerated(obj):
            raise AlreadyAcceleratedError(f"the {name} is already accelerated (perfscope.accelerate returned it); "
                                          f"pass the original objects, once")
    param = next(model.parameters(), None)
    acc = Accelerator(cfg, param.device if param is not None else torch.device("cpu"))
    cuda = acc.device.type == "cuda"
    model = _apply_precision(acc, model, optimizer, cuda)
    model = _apply_parallel(acc, model)
    if optimizer is not None:
        acc.accum_steps = cfg.grad_accum_steps
        if cfg.grad_accum_steps > 1:
            acc.applied["grad_accum_steps"] = (f"optimizer steps every {cfg.grad_accum_steps} micro-steps; "
                                               f"backward divides the loss by {cfg.grad_accum_steps}")
        optimizer = AcceleratedOptimizer(optimizer, acc)
    elif cfg.grad_accum_steps > 1:
        acc.skipped["grad_accum_steps"] = "no optimizer given to accelerate()"
    if loader is not None:
        loader = _apply_loader(acc, loader, cuda)
    for obj in (model, getattr(model, "module", None), optimizer, loader):
        if obj is not None:
            try:
                _accelerated.add(obj)
            except TypeError:  # e.g. a plain list as the loader: nothing to guard
                pass
    acc.model, acc.optimizer, acc.loader = model, optimizer, loader
    _active = acc
    patching.note_accelerated(acc.applied)  # under `perfscope profile --config`: these knobs took effect
    return model, optimizer, loader


def _check_types(model, optimizer, loader) -> None:
    """One-line ``TypeError`` naming the argument, before anything is applied (arguments swapped,
    or a model's ``parameters()`` passed as the optimizer, would otherwise fail deep inside)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"accelerate(): model must be a torch.nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"accelerate(): optimizer must be a torch.optim.Optimizer or None, got {type(optimizer).__name__}")
    if loader is not None and not (hasattr(type(loader), "__iter__") or hasattr(type(loader), "__getitem__")):
        raise TypeError(f"accelerate(): loader must be a DataLoader or another iterable of batches, or None, "
                        f"got {type(loader).__name__}")


def _is_accelerated(obj) -> bool:
    try:
        return obj in _accelerated
    except TypeError:  # not weak-referenceable or unhashable: accelerate cannot have returned it
        return False


def _apply_precision(acc: Accelerator, model: nn.Module, optimizer, cuda: bool) -> nn.Module:
    cfg = acc.config
    for key, what in precision.set_backend_flags(cfg.tf32, cfg.cudnn_benchmark).items():
        acc.applied[key] = what if torch.cuda.is_available() else f"{what} (no effect: no CUDA device)"
    acc.applied.update(threads.set_intra_op_threads(cfg.intra_op_threads))
    if cfg.amp_level == "O0":
        return model
    if cuda and cfg.amp_dtype == "bf16" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"config key 'amp_dtype': 'bf16' is not supported on {acc.device} "
                          f"({torch.cuda.get_device_name(acc.device)}); allowed here: fp16")
    if cfg.amp_dtype == "fp16":
        acc.scaler = torch.amp.GradScaler(acc.device.type)
    scaling = ", GradScaler loss scaling" if acc.scaler is not None else ""
    if cfg.amp_level == "O1":
        acc.applied["amp_level"] = f"O1: forward under torch.autocast('{acc.device.type}', {acc.amp_dtype}){scaling}"
        return model
    from torch.nn.parallel import DistributedDataParallel

    if optimizer is None:
        raise ConfigError("config key 'amp_level': 'O2' keeps fp32 master weights in the optimizer; "
                          "pass the optimizer to accelerate(), or use amp_level O0 or O1")
    if isinstance(model, DistributedDataParallel):
        raise ConfigError("config key 'amp_level': 'O2' converts the model before DistributedDataParallel wraps it; "
                          "pass the unwrapped module (accelerate wraps it), or use amp_level O0 or O1")
    acc.masters = precision.MasterWeights(optimizer, model, acc.amp_dtype)
    acc.masters.convert_model()
    acc.applied["amp_level"] = (f"O2: {len(acc.masters.pairs)} weights in {acc.amp_dtype}, fp32 master weights in "
                                f"the optimizer, norm layers fp32{scaling}")
    return model


def _apply_parallel(acc: Accelerator, model: nn.Module) -> nn.Module:
    cfg = acc.config
    changed = [k for k in ("bucket_cap_mb", "static_graph", "hierarchical_allreduce", "grad_compression")
               if k in cfg.changes()]
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        for key in changed:
            acc.skipped[key] = "no torch.distributed process group initialised"
        return model
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        for key in changed:
            acc.skipped[key] = "the model is already DistributedDataParallel (pass the unwrapped module)"
        return model
    from perfscope.runtime.parallel import wrap_ddp

    bucket = cfg.bucket_cap_mb or DDP_DEFAULT_BUCKET_MB
    ddp = wrap_ddp(model, bucket_cap_mb=bucket, static_graph=cfg.static_graph,
                   grad_compression=cfg.grad_compression, hierarchical_allreduce=cfg.hierarchical_allreduce,
                   device_ids=[acc.device.index] if acc.device.type == "cuda" else None)
    acc.applied["ddp"] = (f"DistributedDataParallel(bucket_cap_mb={bucket}, static_graph={cfg.static_graph}, "
                          f"gradient_as_bucket_view=True, grad_compression={cfg.grad_compression}, "
                          f"hierarchical_allreduce={cfg.hierarchical_allreduce})")
    return ddp


def _apply_loader(acc: Accelerator, loader, cuda: bool):
    from torch.utils.data import DataLoader

    cfg = acc.config
    knobs = {k: getattr(cfg, k) for k in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
             if getattr(cfg, k) is not None}
    if knobs.get("pin_memory") and not torch.cuda.is_available():
        acc.skipped["pin_memory"] = "no CUDA device (pinned memory only speeds host-to-GPU copies)"
        del knobs["pin_memory"]
    if knobs.get("num_workers") and iterable_without_sharding(loader, knobs["num_workers"]):
        acc.skipped["num_workers"] = ITERABLE_SKIP_REASON
        del knobs["num_workers"]
    workers = knobs.get("num_workers", getattr(loader, "num_workers", 0))
    for key in ("prefetch_factor", "persistent_workers"):
        if knobs.get(key) and workers == 0:
            acc.skipped[key] = "the loader has num_workers 0 (set num_workers > 0 in the config)"
            del knobs[key]
    if knobs:
        if type(loader) is DataLoader:
            loader = rebuild_loader(loader, **knobs)
            for key, value in knobs.items():
                acc.applied[key] = f"DataLoader rebuilt with {key}={value}"
        else:
            for key in knobs:
                acc.skipped[key] = f"the loader is a {type(loader).__name__}, not a torch DataLoader"
    if cfg.device_prefetch:
        if cuda:
            loader = DevicePrefetcher(loader, acc.device)
            acc.applied["device_prefetch"] = f"batches copied to {acc.device} on a side CUDA stream one step ahead"
        else:
            acc.skipped["device_prefetch"] = f"the model is on {acc.device}, not a CUDA device"
    return loader


def active_accelerator() -> Accelerator | None:
    """The Accelerator of the latest ``accelerate`` call that applied a configuration, or None."""
    return _active


def autocast():
    """The active accelerator's forward context (autocast at O1); a no-op without one."""
    return _null() if _active is None else _active.autocast()


def backward(loss: torch.Tensor, **kwargs) -> None:
    """The active accelerator's :meth:`Accelerator.backward`; plain ``loss.backward()`` without one."""
    if _active is None:
        control.note_loss(loss)
        loss.backward(**kwargs)
    else:
        _active.backward(loss, **kwargs)
