"""The acceleration runtime on CPU, precision: the autocast state inside forward at AMP O0/O1/O2,
O2's half weights with fp32 masters and norms (saved and restored by a checkpoint), the backend
flags, bf16 loss trajectories within tolerance of fp32, and fp16 loss scaling."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from runtimekit import (
    clean_state,  # noqa: F401 (autouse fixture)
    data,
    mlp,
)
from torch import nn

import perfscope
from perfscope.runtime import accelerator as accel_mod


def train(config, steps: int = 20, lr: float = 0.05) -> list[float]:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model, opt, _ = perfscope.accelerate(model, opt, config=config)
    x, y = data(n=32).tensors
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with perfscope.autocast():
            loss = nn.functional.mse_loss(model(x), y)
        perfscope.backward(loss)
        opt.step()
        losses.append(loss.item())
    accel_mod._active = None
    return losses


# --- precision ------------------------------------------------------------------------------------


class Probe(nn.Module):
    """Records the autocast state its forward runs under."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen = None

    def forward(self, x):
        self.seen = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), x.dtype)
        return self.lin(x)


@pytest.mark.parametrize("level, dtype, enabled, seen_dtype", [
    ("O0", "bf16", False, None),
    ("O1", "bf16", True, torch.bfloat16),
    ("O1", "fp16", True, torch.float16),
    ("O2", "bf16", False, None),
])
def test_autocast_state_seen_inside_forward(level, dtype, enabled, seen_dtype):
    model = Probe()
    model, _, _ = perfscope.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                       config={"amp_level": level, "amp_dtype": dtype})
    with perfscope.autocast():
        out = model(torch.randn(2, 4))
    assert model.seen[0] is enabled
    if enabled:
        assert model.seen[1] == seen_dtype
    if level == "O2":
        assert model.seen[2] == torch.bfloat16 and out.dtype == torch.float32  # cast in, fp32 out
    assert (perfscope.accelerator().scaler is not None) == (dtype == "fp16" and level != "O0")


def test_o2_dtypes_weights_half_masters_fp32_norms_fp32():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(2, 4, 3), nn.BatchNorm1d(4), nn.GroupNorm(2, 4), nn.Flatten(),
                          nn.Linear(24, 8), nn.LayerNorm(8), nn.Linear(8, 1))
    fp32 = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, opt, _ = perfscope.accelerate(model, opt, config={"amp_level": "O2", "amp_dtype": "bf16"})
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm1d, nn.GroupNorm, nn.LayerNorm)):
            assert all(t.dtype == torch.float32 for t in [*m.parameters(), *m.buffers()] if t.is_floating_point())
        elif isinstance(m, (nn.Conv1d, nn.Linear)):
            assert all(p.dtype == torch.bfloat16 for p in m.parameters())
    masters = [p for g in opt.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in masters)
    assert all(torch.equal(a, b) for a, b in zip(fp32, masters))  # exact fp32 copies, not rounded
    out = model(torch.randn(3, 2, 8))
    assert out.dtype == torch.float32
    perfscope.backward(out.square().mean())
    opt.step()
    pairs = perfscope.accelerator().masters.pairs
    assert all(torch.equal(p, m.to(p.dtype)) for p, m in pairs)  # masters copied back into the model


def test_backend_flags_are_set():
    model = mlp()
    for value in (True, False):
        perfscope.accelerate(model if value else mlp(), config={"tf32": value, "cudnn_benchmark": value})
        assert torch.backends.cuda.matmul.allow_tf32 is value
        assert torch.backends.cudnn.allow_tf32 is value
        assert torch.backends.cudnn.benchmark is value
        assert set(perfscope.accelerator().applied) == {"tf32", "cudnn_benchmark"}


# Stated tolerance: bf16 keeps ~3 significant digits; each of the 20 steps' loss stays within 10%
# (plus 0.01 absolute, for losses near 0) of the fp32 loss on this small regression (measured: O1
# within 4.6%, O2 within 1.9%).
@pytest.mark.parametrize("level", ["O1", "O2"])
def test_bf16_loss_trajectory_tracks_fp32(level):
    reference = train({"amp_level": "O0"})
    losses = train({"amp_level": level, "amp_dtype": "bf16"})
    assert reference[-1] < 0.3 * reference[0]  # it does learn
    for got, want in zip(losses, reference):
        assert abs(got - want) <= 0.1 * want + 0.01, (level, losses, reference)


def test_fp16_o2_scaling_skips_overflowing_steps_and_trains():
    losses = train({"amp_level": "O2", "amp_dtype": "fp16"})
    assert losses[-1] < 0.3 * losses[0]
    model = mlp()
    model, opt, _ = perfscope.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                         config={"amp_level": "O2", "amp_dtype": "fp16"})
    acc = perfscope.accelerator()
    before = [p.detach().clone() for p in model.parameters()]
    scale = acc.scaler.get_scale()
    perfscope.backward(model(torch.full((2, 8), 1e4)).sum() * 1e30)  # overflows fp16 gradients
    opt.step()
    assert acc.steps_skipped == 1 and acc.scaler.get_scale() == scale / 2
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


# --- checkpoints ----------------------------------------------------------------------------------


def _o2_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 1))


def test_o2_checkpoint_saves_and_restores_the_fp32_masters():
    model = _o2_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    fp32 = {k: v.clone() for k, v in model.state_dict().items()}
    model, opt, _ = perfscope.accelerate(model, opt, config={"amp_level": "O2"})
    saved = model.state_dict()
    # the user's keys, the exact fp32 values (not the bf16-rounded model weights)
    assert set(saved) == set(fp32)
    for k in fp32:
        assert saved[k].dtype == torch.float32 and torch.equal(saved[k], fp32[k]), k

    # resume: loading a checkpoint after accelerate must survive the next step (lr 0 keeps it)
    ckpt = {k: v + 0.125 for k, v in fp32.items()}
    model.load_state_dict(ckpt)
    opt.zero_grad()
    perfscope.backward(model(torch.randn(4, 8)).sum())
    opt.step()
    after = model.state_dict()
    for k in ckpt:
        assert torch.equal(after[k], ckpt[k]), k
