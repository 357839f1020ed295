"""A training script that fails before its first step (its data cannot be opened), for the bad-input
tests of ``perfscope tune``: the baseline run fails, and the command must say so in one line."""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.parse_args()
    torch.manual_seed(0)
    raise FileNotFoundError("cannot open the training set: /data/missing.tfrecord")


if __name__ == "__main__":
    main()
