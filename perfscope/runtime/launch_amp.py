"""Mixed precision for an unmodified script: bf16 autocast (O1) around its outermost module call.

``perfscope.accelerate`` wraps the model's forward in ``torch.autocast``; a script that does not
call it can still get O1 at launch (``perfscope profile --config``, a tuning trial). PyTorch's
global module hooks run around every ``nn.Module`` call: the pre-hook of the outermost call (depth
0 on this thread) enters ``torch.autocast(device_type, dtype=torch.bfloat16)``, and its forward
hook, registered with ``always_call=True`` so it runs even when the forward raises, leaves it. Inner
module calls only count the depth. Only **training forwards** are cast: an outermost call of a module
with parameters that require gradients, made while autograd records. A forward under
``torch.no_grad()`` (evaluation, or a script making its data with a fixed "teacher" model) and a
loss module without parameters stay in fp32, so the knob changes the training step only, as
``perfscope.accelerate`` does for the model it is given. ``backward()`` runs outside autocast, as
PyTorch recommends. Where autocast is already on at the outermost call (the script's own
``torch.autocast``, or ``perfscope.accelerate``'s), nothing is entered. The device type is that of
the module's first parameter.

Only bf16 O1 can be applied this way: fp16 needs a loss scaler around ``backward`` and the
optimizer step, and O2 needs fp32 master weights in the optimizer -- both are in the training loop,
where only ``perfscope.accelerate`` reaches (``docs/runtime.md``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.modules import module as nn_module

WHAT = "torch.autocast(bfloat16) around the script's outermost nn.Module calls (global forward hooks)"


class OutermostAutocast:
    """The pair of global hooks (module docstring); per-thread state, so a DataLoader thread or a
    second training thread has its own depth."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        self.dtype = dtype
        self._local = threading.local()
        self.entered = 0  # outermost calls that entered autocast (for the run's report and tests)

    def _state(self):
        st = self._local
        if not hasattr(st, "depth"):
            st.depth, st.ctx = 0, None
        return st

    def pre(self, module: nn.Module, args) -> None:
        st = self._state()
        if st.depth == 0 and torch.is_grad_enabled():
            device_type = _trained_device(module)
            if device_type is not None and not torch.is_autocast_enabled(device_type):
                st.ctx = torch.autocast(device_type, dtype=self.dtype)
                st.ctx.__enter__()
                self.entered += 1
        st.depth += 1

    def post(self, module: nn.Module, args, output) -> None:
        st = self._state()
        st.depth = max(0, st.depth - 1)
        if st.depth == 0 and st.ctx is not None:
            ctx, st.ctx = st.ctx, None
            ctx.__exit__(None, None, None)


def _trained_device(module: nn.Module) -> str | None:
    """The device type of the module's first parameter that requires gradients (None: none does)."""
    for p in module.parameters():
        if p.requires_grad:
            return p.device.type
    return None


@contextlib.contextmanager
def launch_autocast() -> Iterator[OutermostAutocast]:
    """Install the global hooks for a ``with`` block (a patched script run); removed after it."""
    hooks = OutermostAutocast()
    pre = nn_module.register_module_forward_pre_hook(hooks.pre)
    try:
        post = nn_module.register_module_forward_hook(hooks.post, always_call=True)
    except BaseException:
        pre.remove()
        raise
    try:
        yield hooks
    finally:
        post.remove()
        pre.remove()
