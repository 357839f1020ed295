"""Shared test fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

# Real Kineto traces recorded by public projects live next to the repository, never inside it.
SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The folder of real traces (``<repo>/../shared/traces``); skips the test when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not available: {SHARED_TRACES} does not exist")
    return SHARED_TRACES
