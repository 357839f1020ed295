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

Each knob group (:mod:`perfscope.runtime.groups`) says what it patches
(:meth:`~perfscope.runtime.groups.base.KnobGroup.launch_patches`); this module installs the
groups' patches; the constructor-patching mechanism they use is :mod:`perfscope.runtime.constructors`.
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
import os
import threading
from collections.abc import Iterator

from perfscope.runtime.config import AccelConfig, load_config
from perfscope.runtime.groups import GROUPS
from perfscope.runtime.groups.base import KnobGroup
from perfscope.runtime.constructors import (  # noqa: F401 - re-exported: the groups' mechanism
    ACCELERATED_ATTR, PATCHED_ATTR, patch_init, suspended,
)
from perfscope.runtime.patch_report import PatchReport

_lock = threading.Lock()
_active = 0  # nesting depth: patches may not be stacked
_report: PatchReport | None = None  # the active session's report, for accelerate() to complete


def note_accelerated(applied: dict[str, str]) -> None:
    """Called by ``perfscope.accelerate``: inside a :func:`patched` session, record its knobs."""
    if _report is not None:
        _report.note_accelerated(applied)


def plan(config: AccelConfig, groups: tuple[KnobGroup, ...] = GROUPS) -> PatchReport:
    """The report for ``config`` without installing anything (what :func:`patched` will do):
    each group's :meth:`~perfscope.runtime.groups.base.KnobGroup.launch_plan`."""
    report = PatchReport()
    for group in groups:
        group.launch_plan(config, report)
    return report


@contextlib.contextmanager
def patched(config: str | os.PathLike | dict | AccelConfig | None,
            groups: tuple[KnobGroup, ...] = GROUPS) -> Iterator[PatchReport]:
    """Install the zero-code-change patches for ``config``; remove them all on exit.

    Args:
        config: A configuration (object, dict, YAML path) or None: then ``$PERFSCOPE_CONFIG``,
            else nothing is patched (an empty report).
        groups: The knob groups whose launch-time patches to install (default: all).

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
    report = plan(config, groups)
    with _lock:
        if _active:
            raise RuntimeError("perfscope.runtime.patching.patched() is already active in this process")
        _active += 1
    try:
        with contextlib.ExitStack() as stack:
            for group in groups:
                for patch in group.launch_patches(config, report):
                    stack.enter_context(patch)
            _report = report
            yield report
    finally:
        with _lock:
            _active -= 1
            _report = None
