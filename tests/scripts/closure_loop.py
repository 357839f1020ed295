"""A training loop whose optimizer takes a closure (``optimizer.step(closure)``, as LBFGS and
Lightning's automatic optimization call it): forward and backward run inside the optimizer's step."""

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(256, 512)

    def closure():
        optimizer.zero_grad()
        loss = model(data).square().mean()
        loss.backward()
        return loss

    for _ in range(args.steps):
        optimizer.step(closure)


if __name__ == "__main__":
    main()
