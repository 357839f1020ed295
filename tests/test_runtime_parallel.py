"""The data-parallel runtime: wrap_ddp's knobs, compression, hierarchical all-reduce, no_sync.

The multi-process checks run once: four gloo processes arranged as 2 nodes x 2 ranks
(``LOCAL_WORLD_SIZE=2``) execute every scenario in ``ddp_workers.run_all`` and save what they
saw; the tests below assert on it. Tolerances: fp32 paths differ from flat DDP only by
summation order (atol 1e-6); with compression, gradients within 2e-3 (fp16) / 2e-2 (bf16) of the
largest gradient of their tensor, loss trajectories within 1e-3 (fp16) / 5e-3 (bf16) relative
(observed: 8e-4 / 7e-3 and 5e-5 / 3e-4).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import socket
import time
from multiprocessing import forkserver

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import ddp_workers  # noqa: E402
from perfscope.runtime.hierarchical import resolve_local_world_size  # noqa: E402
from perfscope.runtime.parallel import sync_context, wrap_ddp  # noqa: E402

WORLD, LOCAL = 4, 2
TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(fn, nprocs: int, args: tuple, timeout_s: float) -> None:
    """Runs ``fn(rank, *args)`` in ``nprocs`` fresh processes; kills them all on timeout.

    The processes come from a forkserver that imported torch once: on two cores, four spawned
    interpreters each importing torch took ~10 s longer. (Plain fork is unsafe once the test
    process has used torch's thread pools.) The forkserver is stopped afterwards.
    """
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "ddp_workers"])
    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=0.5):  # raises when a worker fails (and ends the others)
            if time.monotonic() > deadline:
                raise TimeoutError(f"DDP workers did not finish within {timeout_s} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
            proc.join()
        stop = getattr(forkserver._forkserver, "_stop", None)  # private, hence the guard
        if stop is not None:
            stop()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """What each of the 4 ranks observed (index = rank)."""
    out = tmp_path_factory.mktemp("ddp")
    spawn(ddp_workers.run_all, WORLD, (WORLD, LOCAL, free_port(), str(out)), TIMEOUT_S)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


def close(a: list, b: list, atol: float) -> bool:
    return len(a) == len(b) and all(torch.allclose(x, y, rtol=0, atol=atol) for x, y in zip(a, b))


def rel_close(a: list, b: list, tol: float) -> bool:
    """Every tensor of ``a`` within ``tol`` times the largest magnitude in ``b``'s counterpart."""
    return all((x - y).abs().max() <= tol * y.abs().max() for x, y in zip(a, b))


# --------------------------------------------------------------------------- hierarchical


def test_flat_ddp_matches_the_independent_average(ranks):
    for res in ranks:
        ar = res["allreduce"]
        assert close(ar["grads_flat"], ar["expected"], 1e-6)
    # Different data per rank (different first losses), so the average is non-trivial.
    assert len({r["allreduce"]["losses_flat"][0] for r in ranks}) == WORLD


@pytest.mark.parametrize("run", ["hier", "hier_one_bucket", "hier_one_node", "hier_rank_per_node"])
def test_hierarchical_gradients_equal_flat(ranks, run):
    for res in ranks:
        ar = res["allreduce"]
        assert ar[f"hook_{run}"] == "hierarchical_allreduce_hook"
        assert close(ar[f"grads_{run}"], ar["grads_flat"], 1e-6), (res["rank"], run)
    # Every rank ends with the same averaged gradient.
    assert all(close(r["allreduce"][f"grads_{run}"], ranks[0]["allreduce"][f"grads_{run}"], 1e-7) for r in ranks)


@pytest.mark.parametrize("run", ["hier", "hier_one_bucket"])
def test_hierarchical_loss_trajectory_equals_flat(ranks, run):
    for res in ranks:
        ar = res["allreduce"]
        assert len(ar[f"losses_{run}"]) == ddp_workers.STEPS
        assert torch.allclose(torch.tensor(ar[f"losses_{run}"]), torch.tensor(ar["losses_flat"]), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- compression


@pytest.mark.parametrize(("comp", "grad_tol", "loss_tol"), [("fp16", 2e-3, 1e-3), ("bf16", 2e-2, 5e-3)])
@pytest.mark.parametrize("hier", [False, True])
def test_compression_hooks_registered_and_close_to_flat(ranks, comp, grad_tol, loss_tol, hier):
    run = f"hier_{comp}" if hier else comp
    for res in ranks:
        ar = res["allreduce"]
        flat_hook = "fp16_compress_hook" if comp == "fp16" else "gloo_bf16_compress_hook"
        assert ar[f"hook_{run}"] == ("hierarchical_allreduce_hook" if hier else flat_hook)
        assert rel_close(ar[f"grads_{run}"], ar["grads_flat"], grad_tol)
        losses, flat = torch.tensor(ar[f"losses_{run}"]), torch.tensor(ar["losses_flat"])
        assert torch.allclose(losses, flat, rtol=loss_tol, atol=0)
        assert losses[-1] < 0.8 * losses[0]  # still trains


# --------------------------------------------------------------------------- knobs


def test_ddp_knobs_read_back(ranks):
    for res in ranks:
        a, b = res["flags"]["a"], res["flags"]["b"]
        assert a["bucket_cap_mb"] == 0.25 and b["bucket_cap_mb"] == 3.0
        assert a["static_graph"] and a["log_static_graph"]
        assert not b["static_graph"] and not b["log_static_graph"]
        assert a["gradient_as_bucket_view"] and a["log_gradient_as_bucket_view"]
        assert not b["gradient_as_bucket_view"] and not b["log_gradient_as_bucket_view"]


def test_sync_only_on_the_last_micro_step(ranks):
    for res in ranks:
        counts = res["sync"]["counts"]  # hook calls after each of 2 windows x 3 micro-steps
        # (DDP rebuilds its buckets after the first synced iteration, so windows may differ.)
        assert counts[0] == counts[1] == 0 < counts[2] == counts[3] == counts[4] < counts[5]
        assert res["sync"]["agree_static_False"] == [False, False, True] * 2
        # A static graph syncs its very first micro-step too (a DDP bug; see sync_context).
        assert res["sync"]["agree_static_True"] == [True, False, True] + [False, False, True]
        for static in (False, True):
            # Local accumulation then one hierarchical all-reduce = average of the summed gradients.
            errors = res["sync"][f"error_static_{static}"]
            assert len(errors) == 2 and max(errors) < 1e-6


def test_two_by_two_layout(ranks):
    for rank, res in enumerate(ranks):
        layout = res["layout_errors"]["layout"]
        assert not layout["flat"]
        assert (layout["node"], layout["local_rank"]) == divmod(rank, LOCAL)
        node, local = divmod(rank, LOCAL)
        assert layout["intra"] == [node * LOCAL, node * LOCAL + 1]
        assert layout["inter"] == [local, local + LOCAL]


def test_errors_in_a_process_group(ranks):
    for res in ranks:
        err = res["layout_errors"]
        for key in ("not_multiple", "not_multiple_state"):
            assert err[key] and "world size 4" in err[key] and "local_world_size 3" in err[key]
        assert err["double_wrap"] and "already wrapped" in err["double_wrap"]
        assert err["bad_local_rank"] and "node by node" in err["bad_local_rank"]


# --------------------------------------------------------------------------- single process


def test_wrap_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match="init_process_group"):
        wrap_ddp(torch.nn.Linear(2, 2), bucket_cap_mb=25, static_graph=False)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"grad_compression": "int8"}, "grad_compression must be one of none, fp16, bf16"),
        ({"bucket_cap_mb": 0}, "bucket_cap_mb must be a positive"),
        ({"bucket_cap_mb": True}, "bucket_cap_mb must be a positive"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = {"bucket_cap_mb": 25, "static_graph": False} | kwargs
    with pytest.raises(ValueError, match=match):
        wrap_ddp(torch.nn.Linear(2, 2), **args)


def test_sync_context_without_ddp_and_bad_steps():
    model = torch.nn.Linear(2, 2)
    for step in range(4):
        assert isinstance(sync_context(model, step, 2), contextlib.nullcontext)
    with pytest.raises(ValueError, match="grad_accum_steps must be >= 1"):
        sync_context(model, 0, 0)
    with pytest.raises(ValueError, match="micro_step must be >= 0"):
        sync_context(model, -1, 2)


def test_local_world_size_from_env(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert resolve_local_world_size() == 8
    assert resolve_local_world_size(2) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "eight")
    with pytest.raises(ValueError, match=r"\$LOCAL_WORLD_SIZE must be a positive integer"):
        resolve_local_world_size()
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(ValueError, match="set LOCAL_WORLD_SIZE"):
        resolve_local_world_size()
    with pytest.raises(ValueError, match="local_world_size must be a positive integer"):
        resolve_local_world_size(0)
