"""A regression loop whose loss half precision cannot represent, for the numerics guard's test.

The targets sit near 1000 and differ from the model's output by about 0.01: bf16 keeps 8
significant bits (a spacing of 4 to 8 at 1000), so under autocast (``amp_level: O1``) the model's
output is rounded by more than the whole fp32 error, and the loss departs from the fp32 loss. It
uses ``perfscope.accelerate``, so the tuner can search its AMP level.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import perfscope


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(args.steps * 8, 32)
    teacher = nn.Linear(32, 1)
    with torch.no_grad():
        teacher.bias.fill_(1000.0)
        y = teacher(x) + 0.01 * torch.randn(args.steps * 8, 1)
    model = nn.Linear(32, 1)
    model.load_state_dict(teacher.state_dict())  # starts at the fp32 optimum: loss about 1e-4
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
    model, optimizer, loader = perfscope.accelerate(model, optimizer, loader)
    for xb, yb in loader:
        optimizer.zero_grad()
        with perfscope.autocast():
            out = model(xb)
        loss = nn.functional.mse_loss(out.float(), yb)
        perfscope.backward(loss)
        optimizer.step()


if __name__ == "__main__":
    main()
