"""The measurement runner with DistributedDataParallel: a DDP module built by the script under a
config, one built by ``perfscope.accelerate`` (not patched twice), and two ranks under torchrun."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
from measurekit import (
    ROOT,
    EXAMPLES,
    no_config_from_env,  # noqa: F401 (autouse fixture)
    result,
    run_cli,
    step_lines,
    write_config,
)

from perfscope.measure import runner as measure

# --------------------------------------------------------------------------- DDP
DDP_ACCELERATED = """
import torch, torch.distributed as dist
import perfscope
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt, _ = perfscope.accelerate(model, opt, config={CONFIG!r})
for _ in range(20):
    opt.zero_grad()
    perfscope.backward(model(torch.randn(4, 8)).square().mean())
    opt.step()
dist.destroy_process_group()
"""


def test_ddp_built_by_the_script_under_a_config(tmp_path):
    config = write_config(tmp_path, "bucket_cap_mb: 50\n")
    res = measure.measure_in_process(EXAMPLES / "comm_bound.py", ["--steps", "10", "--width", "64"],
                                     record_dir=tmp_path / "rec", warmup_steps=1, measure_steps=2, config=config)

    assert res["exit_code"] == 0
    assert res["facts"]["ddp"] == {"bucket_cap_mb": 50.0, "static_graph": False}
    assert res["facts"]["dist_backend"] == "gloo" and res["facts"]["world_size"] == 1
    assert res["config_applied"]["ddp_modules"] == 1  # the launch patch still sees the script's call
    assert all(rec["samples"] is None for rec in step_lines(tmp_path / "rec"))


def test_ddp_built_by_accelerate_is_not_patched_again(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(DDP_ACCELERATED.replace("{CONFIG!r}", repr({"bucket_cap_mb": 40.0, "static_graph": True})))
    config = write_config(tmp_path, "bucket_cap_mb: 10\n")
    res = measure.measure_in_process(script, [], record_dir=tmp_path / "rec", warmup_steps=1, measure_steps=2,
                                     config=config)

    assert res["exit_code"] == 0, res["error"]
    # The measurement's own DDP wrapper must not hide accelerate's call from the launch patch.
    assert res["config_applied"]["ddp_modules"] == 0
    assert res["facts"]["ddp"] == {"bucket_cap_mb": 40.0, "static_graph": True}
    assert res["loss_source"] == "perfscope.backward"


@pytest.mark.slow
def test_two_ranks_under_torchrun(tmp_path):
    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "1", "--measure-steps", "2", script=EXAMPLES / "comm_bound.py",
                   args=["--steps", 12], launcher=["-m", "torch.distributed.run", "--standalone",
                                                   "--nproc-per-node", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]

    for rank in (0, 1):
        lines = step_lines(out, rank)
        assert [rec["measured"] for rec in lines] == [False, True, True]
        assert all(rec["samples"] is None and rec["data_wait_s"] == 0 for rec in lines)
        res = result(out, rank)
        assert res["exit_code"] == 0 and res["stopped_early"] and res["steps_seen"] == 3
        assert res["loss_source"] == "autograd.backward"
        facts = res["facts"]
        assert facts["world_size"] == 2 and facts["local_world_size"] == 2 and facts["dist_backend"] == "gloo"
        assert facts["ddp"] == {"bucket_cap_mb": 25.0, "static_graph": False}
        assert facts["dataloader"] is None


@pytest.mark.slow
def test_an_fsdp2_run_is_seen_and_its_resharding_searched(tmp_path):
    from perfscope.tuner.space import build_space, rule_based_guess

    out = tmp_path / "rec"
    proc = run_cli(out, "--warmup-steps", "1", "--measure-steps", "2", script=ROOT / "tests" / "scripts" / "fsdp2_train.py",
                   args=["--steps", 12], launcher=["-m", "torch.distributed.run", "--standalone",
                                                   "--nproc-per-node", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = result(out)["facts"]
    assert facts["model"]["fsdp"] == 2 and facts["ddp"] is None and facts["world_size"] == 2
    space = build_space(facts, {"comm": 0.4, "compute": 0.6}, "comm-bound")
    assert "reshard_after_forward" in space.distributions and "bucket_cap_mb" not in space.distributions
    assert space.excluded["bucket_cap_mb"] == "no DistributedDataParallel model"
    assert rule_based_guess(space, facts, fractions={"comm": 0.4, "compute": 0.6})["reshard_after_forward"] is False
