"""The zero-code-change subset: apply a configuration to an unmodified script by patching at launch.

``perfscope profile --config FILE`` (and a tuning trial) runs the user's script inside
:func:`patched`, which installs, for the duration of the run:

* ``torch.utils.data.DataLoader.__init__``: loaders the script builds get the configured
  ``num_workers``, ``pin_memory``, ``prefetch_factor`` and ``persistent_workers``; every other
  argument the script passed (dataset, sampler, batch size, collate_fn, generator ...) is kept.
  ``prefetch_factor``/``persistent_workers`` are only passed where the loader ends up with
  worker processes (DataLoader rejects them otherwise).
* ``torch.nn.parallel.DistributedDataParallel.__init__``: ``bucket_cap_mb``, ``static_graph`` and
  ``gradient_as_bucket_view=True`` (whenever the config sets a DDP knob), then the communication
  hook: ``grad_compression`` with PyTorch's ``default_hooks.fp16_compress_hook`` /
  ``bf16_compress_hook``, or ``hierarchical_allreduce`` with
  :func:`perfscope.runtime.hierarchical.hierarchical_allreduce_hook` (imported only when needed).
  DDP takes one comm hook: with both set, the hierarchical hook compresses (its ``compress_dtype``).
  A hook PyTorch refuses (its bf16 hook on gloo) is reported under ``not_applied`` with a warning,
  and training goes on without it. Ranks per node come from ``$LOCAL_WORLD_SIZE`` (else all ranks
  are taken to share one node). A script that registers its own comm hook cannot be combined with a patched hook.
* the backend flags ``tf32`` (``torch.backends.cuda.matmul.allow_tf32`` and
  ``torch.backends.cudnn.allow_tf32``) and ``cudnn_benchmark`` (``torch.backends.cudnn.benchmark``),
  and ``intra_op_threads`` (``torch.set_num_threads``, before the script runs).
* ``amp_level: O1`` with ``amp_dtype: bf16``: autocast around the script's outermost module calls
  (:mod:`perfscope.runtime.launch_amp`, through PyTorch's global module hooks).

Everything is put back when the context exits (original ``__init__`` functions, flag values).
The knobs that need the training loop's cooperation (fp16 or O2 ``amp_level``/``amp_dtype``,
``device_prefetch``, ``grad_accum_steps``) are not patched; the report lists them under
``needs_accelerate``.

Coordination with ``perfscope.accelerate`` (no double application):

* The DDP patch leaves alone a module that ``perfscope.accelerate`` returned: one carrying
  ``_perfscope_accelerated = True`` (:data:`ACCELERATED_ATTR`) or registered in
  ``perfscope.runtime.accelerator``'s set of accelerated objects (``_is_accelerated``).
* Loaders and DDP wrappers constructed *from inside* ``perfscope.runtime`` (accelerate rebuilding a
  loader or wrapping a model) are not patched: the patch looks at the calling module. Code
  elsewhere can also turn the patches off with ``with suspended(): ...``.
* Objects the patch changed carry ``_perfscope_patched`` (:data:`PATCHED_ATTR`): a dict of the
  knobs it applied to them, e.g. ``{"num_workers": 4}``; accelerate may read it (a DDP module
  that already has a patched comm hook must not get a second one).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator

from perfscope.runtime.config import AccelConfig, load_config
from perfscope.runtime.patch_report import NEEDS_ACCELERATE, PatchReport

ACCELERATED_ATTR = "_perfscope_accelerated"
PATCHED_ATTR = "_perfscope_patched"

_LOADER_KNOBS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")
_RUNTIME_PACKAGE = "perfscope.runtime"
_suspended: contextvars.ContextVar[bool] = contextvars.ContextVar("perfscope_patching_suspended", default=False)
_lock = threading.Lock()
_active = 0  # nesting depth: patches may not be stacked
_report: PatchReport | None = None  # the active session's report, for accelerate() to complete


def note_accelerated(applied: dict[str, str]) -> None:
    """Called by ``perfscope.accelerate``: inside a :func:`patched` session, record its knobs."""
    if _report is not None:
        _report.note_accelerated(applied)


def plan(config: AccelConfig) -> PatchReport:
    """The report for ``config`` without installing anything (what :func:`patched` will do)."""
    report = PatchReport()
    for key in _LOADER_KNOBS:
        value = getattr(config, key)
        if value is not None:
            report.applied[key] = f"DataLoader({key}={value!r}) for loaders the script builds"
    if config.bucket_cap_mb is not None:
        report.applied["bucket_cap_mb"] = f"DistributedDataParallel(bucket_cap_mb={config.bucket_cap_mb!r})"
    if config.static_graph:
        report.applied["static_graph"] = "DistributedDataParallel(static_graph=True)"
    if _ddp_knobs_set(config):
        report.applied["gradient_as_bucket_view"] = "DistributedDataParallel(gradient_as_bucket_view=True)"
    if config.hierarchical_allreduce:
        report.applied["hierarchical_allreduce"] = "DDP comm hook perfscope.runtime.hierarchical.hierarchical_allreduce_hook"
        if config.grad_compression != "none":
            report.applied["grad_compression"] = (f"{config.grad_compression} compression inside the "
                                                  "hierarchical all-reduce hook (compress_dtype)")
    elif config.grad_compression != "none":
        report.applied["grad_compression"] = f"DDP comm hook default_hooks.{config.grad_compression}_compress_hook"
    if config.tf32 is not None:
        report.applied["tf32"] = f"torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = {config.tf32}"
    if config.cudnn_benchmark is not None:
        report.applied["cudnn_benchmark"] = f"torch.backends.cudnn.benchmark = {config.cudnn_benchmark}"
    if config.intra_op_threads is not None:
        report.applied["intra_op_threads"] = f"torch.set_num_threads({config.intra_op_threads})"
    if launch_amp(config):
        from perfscope.runtime.launch_amp import WHAT

        report.applied["amp_level"] = WHAT
    elif config.amp_level != "O0":  # fp16 scaling, O2 master weights: in the loop (launch_amp.py says why)
        report.needs_accelerate["amp_level"] = NEEDS_ACCELERATE
        report.needs_accelerate["amp_dtype"] = NEEDS_ACCELERATE
    if config.device_prefetch:
        report.needs_accelerate["device_prefetch"] = NEEDS_ACCELERATE
    if config.grad_accum_steps != 1:
        report.needs_accelerate["grad_accum_steps"] = NEEDS_ACCELERATE
    return report


def launch_amp(config: AccelConfig) -> bool:
    """Whether ``config``'s mixed precision is applied at launch (bf16 O1; :mod:`.launch_amp`)."""
    return config.amp_level == "O1" and config.amp_dtype == "bf16"


def _ddp_knobs_set(config: AccelConfig) -> bool:
    return (config.bucket_cap_mb is not None or config.static_graph or config.hierarchical_allreduce
            or config.grad_compression != "none")


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Within this block (this thread / task), loaders and DDP wrappers are built unpatched."""
    token = _suspended.set(True)
    try:
        yield
    finally:
        _suspended.reset(token)


def _called_from_runtime(depth: int = 2) -> bool:
    """True when the constructor was called by perfscope.runtime code (accelerate), not the script."""
    if _suspended.get():
        return True
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return False
    # Skip torch's own frames (a DataLoader subclass's super().__init__ chain) up to the real caller.
    while frame is not None:
        name = frame.f_globals.get("__name__", "") or ""
        if name == __name__:
            frame = frame.f_back
            continue
        if name.startswith("torch.") or name == "torch":
            frame = frame.f_back
            continue
        return name == _RUNTIME_PACKAGE or name.startswith(_RUNTIME_PACKAGE + ".")
    return False


@contextlib.contextmanager
def patched(config: str | os.PathLike | dict | AccelConfig | None) -> Iterator[PatchReport]:
    """Install the zero-code-change patches for ``config``; remove them all on exit.

    Args:
        config: A configuration (object, dict, YAML path) or None: then ``$PERFSCOPE_CONFIG``,
            else nothing is patched (an empty report).

    Yields:
        The :class:`PatchReport`; its ``loaders``/``ddp_modules`` counts grow as the script
        builds objects.

    Raises:
        ConfigError: an invalid configuration (before anything is patched).
        RuntimeError: ``patched`` is already active (patches are process-wide; no stacking).
    """
    global _active, _report
    config = load_config(config)
    if config is None:
        yield PatchReport()
        return
    report = plan(config)
    with _lock:
        if _active:
            raise RuntimeError("perfscope.runtime.patching.patched() is already active in this process")
        _active += 1
    try:
        with contextlib.ExitStack() as stack:
            if any(getattr(config, k) is not None for k in _LOADER_KNOBS):
                stack.enter_context(_patch_dataloader(config, report))
            if _ddp_knobs_set(config):
                stack.enter_context(_patch_ddp(config, report))
            if config.tf32 is not None or config.cudnn_benchmark is not None:
                from perfscope.runtime.precision import backend_flags  # imports torch

                stack.enter_context(backend_flags(config.tf32, config.cudnn_benchmark))
            if config.intra_op_threads is not None:
                from perfscope.runtime.threads import intra_op_threads  # imports torch

                stack.enter_context(intra_op_threads(config.intra_op_threads))
            if launch_amp(config):
                from perfscope.runtime.launch_amp import launch_autocast  # imports torch

                stack.enter_context(launch_autocast())
            _report = report
            yield report
    finally:
        with _lock:
            _active -= 1
            _report = None


# --- DataLoader -----------------------------------------------------------------------------


@contextlib.contextmanager
def _patch_init(cls, adjust: Callable) -> Iterator[None]:
    """Patch ``cls.__init__`` for the session.

    ``adjust(arguments, signature)`` sees the bound constructor arguments of a call made by the
    script and edits them in place; it returns ``finish(obj) -> dict`` to run after the original
    constructor (the dict of changes becomes the object's marker), or None to leave the call alone.
    Calls from perfscope's own runtime (``accelerate``) and calls that do not bind pass through.
    """
    original = cls.__dict__["__init__"]
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if _called_from_runtime():
            return original(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)  # let the class report the script's mistake
        finish = adjust(bound.arguments, signature)
        if finish is None:
            return original(self, *args, **kwargs)
        original(*bound.args, **bound.kwargs)
        changed = finish(self)
        try:
            setattr(self, PATCHED_ATTR, changed)
        except Exception:  # noqa: BLE001 - a class with __slots__: only the marker is lost
            pass

    cls.__init__ = __init__
    try:
        yield
    finally:
        cls.__init__ = original


def _patch_dataloader(config: AccelConfig, report: PatchReport):
    from torch.utils.data import DataLoader

    from perfscope.runtime.data import ITERABLE_SKIP_REASON, iterable_without_sharding

    def adjust(arguments: dict, signature: inspect.Signature):
        new = _loader_arguments(config, arguments)
        if new.get("num_workers") and iterable_without_sharding(_LoaderView(arguments), new["num_workers"]):
            # Keep the script's (main-process) loading; the worker-only knobs go with it.
            new = _loader_arguments(dataclasses.replace(config, num_workers=None, prefetch_factor=None,
                                                        persistent_workers=None), arguments)
            report.not_applied["num_workers"] = ITERABLE_SKIP_REASON
        changed = {k: v for k, v in new.items() if arguments.get(k, _default(signature, k)) != v}
        arguments.update(new)

        def finish(loader) -> dict:
            report.loaders += 1
            return changed

        return finish

    return _patch_init(DataLoader, adjust)


class _LoaderView:
    """The attributes :func:`iterable_without_sharding` reads, from DataLoader arguments."""

    def __init__(self, arguments: dict) -> None:
        self.dataset = arguments.get("dataset")
        self.num_workers = arguments.get("num_workers") or 0


def _default(signature: inspect.Signature, name: str):
    param = signature.parameters.get(name)
    return None if param is None else param.default


def _loader_arguments(config: AccelConfig, arguments: dict) -> dict:
    """The loader arguments to override: the configured ones, made consistent with num_workers."""
    new: dict = {}
    if config.num_workers is not None:
        new["num_workers"] = config.num_workers
    if config.pin_memory is not None:
        new["pin_memory"] = config.pin_memory
    workers = new.get("num_workers", arguments.get("num_workers", 0)) or 0
    if workers > 0:
        if config.prefetch_factor is not None:
            new["prefetch_factor"] = config.prefetch_factor
        if config.persistent_workers is not None:
            new["persistent_workers"] = config.persistent_workers
    else:
        # DataLoader rejects these without worker processes (the config lowered num_workers to 0).
        if arguments.get("prefetch_factor") is not None:
            new["prefetch_factor"] = None
        if arguments.get("persistent_workers"):
            new["persistent_workers"] = False
    return new


# --- DistributedDataParallel ------------------------------------------------------------------


def _patch_ddp(config: AccelConfig, report: PatchReport):
    from torch.nn.parallel import DistributedDataParallel

    def adjust(arguments: dict, signature: inspect.Signature):
        if _accelerated(arguments.get("module")):
            return None  # perfscope.accelerate configured it already
        changed: dict = {"gradient_as_bucket_view": True}
        if config.bucket_cap_mb is not None:
            changed["bucket_cap_mb"] = config.bucket_cap_mb
        if config.static_graph:
            changed["static_graph"] = True
        arguments.update(changed)

        def finish(ddp) -> dict:
            try:
                hook = _register_hook(ddp, config, arguments.get("process_group"))
            except Exception as exc:  # noqa: BLE001 - a hook the backend refuses: train on without it
                knob = "hierarchical_allreduce" if config.hierarchical_allreduce else "grad_compression"
                first = str(exc).splitlines()[0] if str(exc) else ""
                reason = f"comm hook not registered: {type(exc).__name__}: {first}"
                report.not_applied[knob] = reason
                report.applied.pop(knob, None)
                warnings.warn(f"perfscope: config {knob}: {reason}", stacklevel=3)
                hook = None
            if hook:
                changed["comm_hook"] = hook
            report.ddp_modules += 1
            return changed

        return finish

    return _patch_init(DistributedDataParallel, adjust)


def _accelerated(obj) -> bool:
    """True for an object ``perfscope.accelerate`` built or returned (marker, or its registry)."""
    if getattr(obj, ACCELERATED_ATTR, False):
        return True
    accelerator = sys.modules.get("perfscope.runtime.accelerator")
    check = getattr(accelerator, "_is_accelerated", None)
    try:
        return bool(check(obj)) if check is not None else False
    except Exception:  # noqa: BLE001 - a registry we cannot query: treat as not accelerated
        return False


def _register_hook(ddp, config: AccelConfig, process_group) -> str | None:
    # The same hooks perfscope.accelerate registers (imported only when a hook knob is set).
    from perfscope.runtime.parallel import comm_hook

    hook = comm_hook(config.grad_compression, config.hierarchical_allreduce)
    if hook is None:
        return None
    state, fn = hook
    ddp.register_comm_hook(state if state is not None else process_group, fn)
    return fn.__name__
