"""Shared test fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The window-attention operator times its kernel against its ATen formulation at a shape's first
# call and keeps the faster (perfscope.fused_ops.choice): the tests run the kernel itself (those of
# the choice unset this), so that what they check does not depend on this machine's timings.
os.environ.setdefault("PERFSCOPE_NATIVE_CHOICE", "kernel")

# Real Kineto traces recorded by public projects live next to the repository, never inside it.
SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """The folder of real traces (``<repo>/../shared/traces``); skips the test when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not available: {SHARED_TRACES} does not exist")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def postgres_url():
    """``postgresql://USER:PASS@127.0.0.1:PORT/DB`` of a throwaway server run for the session
    (tests/pg.py). Skips without the server binaries, but fails when ``CI`` is set: .ci/run
    installs them."""
    import pg

    try:
        pg.check_available()
    except pg.PostgresUnavailable as e:
        if pg.in_ci():
            pytest.fail(f"CI is set but {e}; .ci/run should have installed it", pytrace=False)
        pytest.skip(str(e))
    with pg.server() as url:
        yield url


@pytest.fixture(scope="session")
def postgres_socket_url(postgres_url):
    """The same server as ``postgres_url``, reached through its Unix socket (for ranks in an
    emulated node's network namespace)."""
    import pg

    return pg.socket_url(postgres_url)



# The limit of a command or a wait a test makes: a hang's safety net, never a speed check. At a
# load of 20-40 on 2 cores a command that takes 5 s when idle takes minutes.
HANG_TIMEOUT_S = 900

ONE_CORE = {0}


def on_one_core():
    """Pin the calling process to core 0 (a ``preexec_fn`` for the process under test)."""
    os.sched_setaffinity(0, ONE_CORE)


@pytest.fixture
def busy_core():
    """Two busy processes on core 0 (killed at the end): a process pinned there with
    :func:`on_one_core` gets about a third of it whatever else the machine does."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("needs Linux CPU affinity")
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=on_one_core)
             for _ in range(2)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()
