"""Helpers of the acceleration-runtime tests on CPU (``test_runtime_sources.py``,
``test_runtime_loader.py``, ``test_runtime_precision.py``, ``test_runtime_accumulation.py``): a
clean state around every test (the autouse fixture, imported by each of those modules), a small
model, a regression data set and a seeded shuffled loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from perfscope.runtime import accelerator as accel_mod

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    """No config from the environment, no active accelerator leaking, backend flags restored."""
    monkeypatch.delenv("PERFSCOPE_CONFIG", raising=False)
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = flags
    accel_mod._active = None


def mlp(norm: nn.Module | None = None) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), norm or nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 1))


def data(n: int = 64, seed: int = 1) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True) * 0.5 + 0.1 * torch.randn(n, 1, generator=g))


def shuffled_loader(**kwargs) -> DataLoader:
    return DataLoader(data(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(3), **kwargs)
