"""A training loop that starts a helper process in a session of its own (as some data services
do), for the test that a trial leaves nothing running: the helper is outside the trial's group."""

from __future__ import annotations

import subprocess
import sys

import torch
from torch import nn


def main() -> None:
    marker = sys.argv[1] if len(sys.argv) > 1 else "tune-spawner-helper"
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", marker], start_new_session=True)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(40):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
