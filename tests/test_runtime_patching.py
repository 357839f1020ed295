"""The zero-code-change subset: patches applied at launch to an unmodified script, and removed after."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from perfscope.collect.script import run_script
from perfscope.runtime.config import CONFIG_ENV, ConfigError
from perfscope.runtime.patching import (
    ACCELERATED_ATTR,
    PATCHED_ATTR,
    patched,
    plan,
    suspended,
)
from conftest import HANG_TIMEOUT_S  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# An unmodified training script's loader: positional batch size, its own collate_fn, generator,
# worker_init_fn and drop_last; it writes what the loader ended up with.
LOADER_SCRIPT = """
import json, os, sys
import torch
from torch.utils.data import DataLoader, TensorDataset

def collate(batch):
    return batch

def init(worker_id):
    pass

ds = TensorDataset(torch.arange(40.0))
gen = torch.Generator().manual_seed(3)
loader = DataLoader(ds, 5, shuffle=True, collate_fn=collate, drop_last=True, worker_init_fn=init,
                    generator=gen, num_workers=0, pin_memory=False)
out = dict(num_workers=loader.num_workers, pin_memory=loader.pin_memory,
           prefetch_factor=loader.prefetch_factor, persistent_workers=loader.persistent_workers,
           batch_size=loader.batch_size, drop_last=loader.drop_last,
           collate=loader.collate_fn is collate, init=loader.worker_init_fn is init,
           generator=loader.generator is gen, dataset=loader.dataset is ds,
           sampler=type(loader.sampler).__name__, len=len(loader),
           patched=getattr(loader, "_perfscope_patched", None),
           env=os.environ.get("PERFSCOPE_CONFIG"),
           rank=os.environ.get("RANK"))
with open(sys.argv[1] + "." + str(out["rank"]), "w") as f:
    json.dump(out, f)
"""


def _run_loader_script(tmp_path: Path, config) -> dict:
    script = tmp_path / "train.py"
    script.write_text(LOADER_SCRIPT)
    out = tmp_path / "loader.json"
    with patched(config) as report:
        outcome = run_script(str(script), [str(out)])
    assert outcome.exit_code == 0, outcome.error
    data = json.loads(Path(f"{out}.None").read_text())
    data["report"] = report
    return data


def test_unmodified_script_loader_gets_settings_and_keeps_the_rest(tmp_path):
    original = DataLoader.__init__
    data = _run_loader_script(
        tmp_path, {"num_workers": 2, "pin_memory": True, "prefetch_factor": 4, "persistent_workers": True}
    )
    assert (data["num_workers"], data["pin_memory"], data["prefetch_factor"], data["persistent_workers"]) == (2, True, 4, True)
    assert data["batch_size"] == 5 and data["drop_last"] is True and data["len"] == 8
    assert data["collate"] and data["init"] and data["generator"] and data["dataset"]
    assert data["sampler"] == "RandomSampler"
    assert data["patched"] == {"num_workers": 2, "pin_memory": True, "prefetch_factor": 4, "persistent_workers": True}
    assert data["report"].loaders == 1
    assert set(data["report"].applied) == {"num_workers", "pin_memory", "prefetch_factor", "persistent_workers"}
    assert DataLoader.__init__ is original  # the patch is gone


def test_loader_sample_order_unchanged():
    def order(config):
        ds = list(range(30))
        with patched(config):
            loader = DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(7))
        return [b.tolist() for b in loader]

    assert order({"num_workers": 2, "prefetch_factor": 2}) == order({})


def test_zero_workers_drops_worker_only_arguments():
    with patched({"num_workers": 0}):
        loader = DataLoader(list(range(8)), batch_size=2, num_workers=2, prefetch_factor=4, persistent_workers=True)
    assert loader.num_workers == 0 and loader.prefetch_factor is None and loader.persistent_workers is False
    # prefetch_factor configured but the script keeps num_workers=0: not passed (DataLoader would refuse)
    with patched({"prefetch_factor": 3}):
        loader = DataLoader(list(range(8)), batch_size=2)
    assert loader.prefetch_factor is None


def test_loaders_built_by_the_runtime_are_not_patched():
    # perfscope.accelerate rebuilds loaders from perfscope.runtime.*: those are left alone.
    namespace = {"__name__": "perfscope.runtime.data", "DataLoader": DataLoader}
    with patched({"num_workers": 2}) as report:
        exec("loader = DataLoader(list(range(8)), batch_size=2)", namespace)  # noqa: S102
        with suspended():
            other = DataLoader(list(range(8)), batch_size=2)
        mine = DataLoader(list(range(8)), batch_size=2)
    assert namespace["loader"].num_workers == 0 and other.num_workers == 0
    assert mine.num_workers == 2 and report.loaders == 1


def test_flags_set_and_restored():
    b = torch.backends
    before = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark)
    with patched({"tf32": not before[0], "cudnn_benchmark": not before[2]}) as report:
        assert b.cuda.matmul.allow_tf32 is (not before[0])
        assert b.cudnn.allow_tf32 is (not before[0])
        assert b.cudnn.benchmark is (not before[2])
    assert (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.benchmark) == before
    assert set(report.applied) == {"tf32", "cudnn_benchmark"}


def test_patches_removed_even_when_the_block_raises():
    from torch.nn.parallel import DistributedDataParallel

    dl, ddp = DataLoader.__dict__["__init__"], DistributedDataParallel.__dict__["__init__"]
    with pytest.raises(KeyError), patched({"num_workers": 1, "bucket_cap_mb": 2, "cudnn_benchmark": True}):
        assert DataLoader.__dict__["__init__"] is not dl
        assert DistributedDataParallel.__dict__["__init__"] is not ddp
        raise KeyError("boom")
    assert DataLoader.__dict__["__init__"] is dl and DistributedDataParallel.__dict__["__init__"] is ddp
    assert "__init__" in DataLoader.__dict__  # put back on the class itself, not deleted
    with patched(None) as report:  # nothing configured: nothing patched
        assert DataLoader.__dict__["__init__"] is dl
    assert report.applied == {}


def test_needs_accelerate_and_env_config(tmp_path, monkeypatch):
    report = plan(_cfg({"amp_level": "O2", "amp_dtype": "fp16", "device_prefetch": True, "grad_accum_steps": 4}))
    assert set(report.needs_accelerate) == {"amp_level", "amp_dtype", "device_prefetch", "grad_accum_steps"}
    assert report.applied == {}
    assert "device_prefetch, amp_level, amp_dtype, grad_accum_steps" in report.needs_accelerate_line()  # config key order
    path = tmp_path / "c.yaml"
    path.write_text("num_workers: 1\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    with patched(None) as report:  # config=None reads $PERFSCOPE_CONFIG
        assert DataLoader(list(range(4))).num_workers == 1
    with pytest.raises(ConfigError, match="num_worker"), patched({"num_worker": 1}):
        pass


def _cfg(d):
    from perfscope.runtime.config import config_from_dict

    return config_from_dict(d)


# --- DDP -----------------------------------------------------------------------------------------


@pytest.fixture
def gloo_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _step(ddp):
    ddp(torch.randn(4, 8)).sum().backward()


@pytest.mark.filterwarnings("ignore:.*broadcast_buffers.*:FutureWarning")
def test_ddp_bucket_size_static_graph_and_compression_hook(gloo_group):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    config = {"bucket_cap_mb": 1.5, "static_graph": True, "grad_compression": "fp16"}
    with patched(config) as report:
        ddp = DDP(nn.Linear(8, 4), broadcast_buffers=False)
    assert ddp.bucket_bytes_cap == int(1.5 * 1024 * 1024)
    assert ddp.static_graph is True and ddp.gradient_as_bucket_view is True
    assert ddp.broadcast_buffers is False  # the script's own argument kept
    assert [h for h, _ in ddp._comm_hooks] == [default_hooks.fp16_compress_hook]
    assert getattr(ddp, PATCHED_ATTR)["comm_hook"] == "fp16_compress_hook"
    assert report.ddp_modules == 1 and "grad_compression" in report.applied
    _step(ddp)  # the hook runs (fp16 all-reduce on gloo)
    assert ddp.module.weight.grad is not None

    plain = DDP(nn.Linear(8, 4))  # after the block: unpatched
    assert plain.bucket_bytes_cap == 25 * 1024 * 1024 and plain._comm_hooks == []


def test_ddp_accelerated_module_skipped_and_bf16_hook_on_gloo(gloo_group):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = nn.Linear(8, 4)
    setattr(model, ACCELERATED_ATTR, True)  # what perfscope.accelerate marks
    with patched({"bucket_cap_mb": 3, "grad_compression": "bf16"}) as report:
        untouched = DDP(model)
        ddp = DDP(nn.Linear(8, 4))  # PyTorch's bf16 hook, under the name DDP accepts on gloo
    assert untouched._comm_hooks == [] and untouched.bucket_bytes_cap == 25 * 1024 * 1024
    assert ddp.bucket_bytes_cap == 3 * 1024 * 1024 and report.ddp_modules == 1
    ((hook, _),) = ddp._comm_hooks
    assert hook.__name__ == "gloo_bf16_compress_hook" and "grad_compression" in report.applied
    _step(ddp)


def test_ddp_hierarchical_hook(gloo_group, monkeypatch):
    from torch.nn.parallel import DistributedDataParallel as DDP

    from perfscope.runtime.hierarchical import hierarchical_allreduce_hook

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    torch.manual_seed(0)
    with patched({"hierarchical_allreduce": True, "grad_compression": "fp16"}) as report:
        ddp = DDP(nn.Linear(8, 4))
    ((hook, state),) = ddp._comm_hooks
    assert hook is hierarchical_allreduce_hook and state.compress_dtype == torch.float16
    assert {"hierarchical_allreduce", "grad_compression"} <= set(report.applied)
    x = torch.randn(4, 8)
    ddp(x).sum().backward()
    ref = nn.Linear(8, 4)
    ref.load_state_dict(ddp.module.state_dict())
    ref(x).sum().backward()
    # world size 1: the mean is the gradient itself, up to the fp16 round trip
    torch.testing.assert_close(ddp.module.weight.grad, ref.weight.grad, rtol=1e-3, atol=1e-3)


# --- the CLI and the launched ranks --------------------------------------------------------------


def _perfscope(tmp_path, *args, timeout=240):
    return subprocess.run([sys.executable, "-m", "perfscope", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("text, needle", [
    ("num_workers: -1\n", "'num_workers'"),
    ("num_worker: 2\n", "unknown config key"),
    ("amp_level: [O1\n", "not valid YAML"),
])
def test_profile_bad_config_is_one_line(tmp_path, text, needle):
    (tmp_path / "bad.yaml").write_text(text)
    proc = _perfscope(tmp_path, "profile", "--config", "bad.yaml", str(ROOT / "examples/io_bound.py"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfscope: error:") and needle in lines[0], proc.stderr
    assert not (tmp_path / "perfscope-out").exists()  # nothing created
    proc = _perfscope(tmp_path, "profile", "--config", "missing.yaml", str(ROOT / "examples/io_bound.py"))
    assert proc.returncode == 2 and "cannot read configuration" in proc.stderr


def test_profile_good_config_records_it(tmp_path):
    (tmp_path / "good.yaml").write_text("num_workers: 2\npin_memory: false\namp_level: O1\namp_dtype: fp16\n"
                                        "cudnn_benchmark: true\n")
    proc = _perfscope(tmp_path, "profile", "--config", "good.yaml", "--out", "out",
                      "--skip-first", "1", "--warmup", "1", "--active", "3",
                      str(ROOT / "examples/io_bound.py"), "--", "--steps", "8", "--decode-ms", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "need perfscope.accelerate" in proc.stderr and "amp_level" in proc.stderr
    run = json.loads((tmp_path / "out/summary.json").read_text())["run"]
    assert run["config"]["num_workers"] == 2 and run["config"]["amp_level"] == "O1"
    assert run["config"]["cudnn_benchmark"] is True and run["config"]["grad_accum_steps"] == 1
    applied = run["config_applied"]
    assert applied["loaders"] == 1 and "num_workers" in applied["applied"]
    assert "amp_level" in applied["needs_accelerate"]


def test_profile_config_reaches_script_and_ranks(tmp_path):
    (tmp_path / "train.py").write_text(LOADER_SCRIPT)
    (tmp_path / "c.yaml").write_text("num_workers: 1\npin_memory: true\n")
    # in-process: the env var and the patched loader
    proc = _perfscope(tmp_path, "profile", "--config", "c.yaml", "--out", "o1", "--max-steps", "0",
                      "train.py", "--", str(tmp_path / "single"))
    assert (tmp_path / "single.None").is_file(), proc.stderr[-2000:]
    data = json.loads((tmp_path / "single.None").read_text())
    assert data["env"] == str(tmp_path / "c.yaml") and data["num_workers"] == 1 and data["pin_memory"] is True
    # two ranks through torch.distributed.run
    proc = _perfscope(tmp_path, "profile", "--config", "c.yaml", "--out", "o2", "--max-steps", "0",
                      "--nproc-per-node", "2", "train.py", "--", str(tmp_path / "ranks"))
    for rank in (0, 1):
        path = tmp_path / f"ranks.{rank}"
        assert path.is_file(), proc.stderr[-3000:]
        data = json.loads(path.read_text())
        assert data["env"] == str(tmp_path / "c.yaml") and data["num_workers"] == 1 and data["batch_size"] == 5


def test_gpu_check_without_cuda_skips_cleanly(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: gpu_check.py would run the real checks")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/gpu_check.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=HANG_TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.split()[:1] and line.split()[0] in
            ("device_prefetch_overlap", "fp16_O2_scaling", "tf32", "nccl_hierarchical_hook")]
    assert len(rows) == 4 and all("SKIP" in r and "no CUDA" in r for r in rows), proc.stdout


def test_knobs_applied_by_accelerate_in_the_script_are_recorded():
    import perfscope

    fp16 = {"amp_level": "O1", "amp_dtype": "fp16", "grad_accum_steps": 2}  # fp16: loss scaling in the loop
    with patched({**fp16, "num_workers": 0}) as report:
        assert set(report.needs_accelerate) >= {"amp_level", "grad_accum_steps"}
        model = nn.Linear(4, 1)
        perfscope.accelerate(model, torch.optim.SGD(model.parameters(), lr=0.1), config=fp16)
    assert "amp_level" in report.by_accelerate and "grad_accum_steps" in report.by_accelerate
    assert "amp_level" not in report.needs_accelerate and "amp_dtype" not in report.needs_accelerate


def test_intra_op_threads_are_set_for_the_run_and_put_back():
    import torch

    from perfscope.runtime.patching import patched

    before = torch.get_num_threads()
    with patched({"intra_op_threads": 1}) as report:
        assert torch.get_num_threads() == 1
        assert report.applied["intra_op_threads"] == "torch.set_num_threads(1)"
    assert torch.get_num_threads() == before


@pytest.mark.slow
def test_the_gpu_scripts_fused_checks_run_on_the_cpu(tmp_path):
    # No GPU in CI: the same code on the CPU, so that the script is known to run when one is lent.
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from gpu_fused_checks import check_optimizers, check_window_attention
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    verdict, number = check_window_attention(tmp_path, device="cpu", reps=1, images=1)
    assert "over tolerance" not in number and "fwd+bwd vs eager" in number, number
    verdict, number = check_optimizers(tmp_path, device="cpu", reps=1, tensors=20)
    assert "lamb: rel err" in number and "lars: rel err" in number, number
    assert all(float(e) < 1e-4 for e in re.findall(r"rel err ([0-9.e+-]+)", number)), number
