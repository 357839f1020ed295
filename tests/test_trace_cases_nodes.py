"""Hand-written trace cases: ranks of a multi-node job grouped by node (perfscope's job record or
distinct host names), a node's clock offset recovered from the collectives, process groups placed
inside or across nodes, and the node the others wait for (see tracekit.py for the conventions)."""

from __future__ import annotations

import pytest
from tracegen import cpu_op, launch, step, write_trace
from tracekit import NCCL_NEW

import perfscope
from perfscope.record.job_facts import JOB_KEY

BASE = 1_700_000_000_000_000_000  # ns
PGS = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1, 2, 3]},
       {"pg_name": "1", "pg_desc": "intra", "ranks": [0, 1]}, {"pg_name": "2", "pg_desc": "intra", "ranks": [2, 3]},
       {"pg_name": "3", "pg_desc": "inter", "ranks": [0, 2]}, {"pg_name": "4", "pg_desc": "inter", "ranks": [1, 3]}]


def _rank(path, rank, compute_us, *, clock_us=0, record=True, host=None, with_groups=False):
    """Three 10 ms steps of 4 ranks on 2 nodes (ranks 0-1 node 0, 2-3 node 1): compute, then an
    all-reduce ending at the same absolute instant on every rank. ``clock_us`` is how far this
    rank's node clock runs ahead (every timestamp shifted)."""
    events = []
    for n in range(3):
        s = 10_000 * n + clock_us
        end = s + 9_000
        events += [step(n + 1, s, 10_000), cpu_op("aten::mm", s, 9_500),
                   *launch("gemm", s + 1, s + 10, compute_us, correlation=10 * n + 1),
                   *launch(NCCL_NEW, s + 2, s + 10 + compute_us, end - (s + 10 + compute_us), correlation=10 * n + 2,
                           stream=20)]
    groups = PGS if with_groups else PGS[:1]
    meta = {"baseTimeNanoseconds": BASE, "distributedInfo": {"rank": rank, "world_size": 4, "pg_config": groups}}
    if record:
        meta[JOB_KEY] = {"version": 1, "node": {"node_rank": rank // 2, "nnodes": 2, "local_rank": rank % 2,
                                                "local_world_size": 2, "host": "vm"}, "ddp": None}
    if host is not None:
        meta["host_name"] = host
    return write_trace(path, events, **meta)


def _job(tmp_path, *, clock_us=0, slow=(3,), **kw):
    d = tmp_path / "job"
    d.mkdir()
    for r in range(4):
        # the ranks in ``slow`` compute 3 ms longer: they arrive late at every all-reduce
        _rank(d / f"rank{r}.json", r, 6_000 if r in slow else 3_000, clock_us=clock_us if r >= 2 else 0, **kw)
    return perfscope.analyze(d)


def test_ranks_are_grouped_by_node_and_a_node_slow_as_a_whole_named(tmp_path):
    nodes = _job(tmp_path, slow=(2, 3)).details.nodes
    assert nodes.source == "perfscope" and nodes.count == 2
    assert [n.ranks for n in nodes.nodes] == [[0, 1], [2, 3]]
    assert [n.clock_offset_us for n in nodes.nodes] == [0.0, 0.0]
    assert nodes.straggler_node.node == 1 and nodes.straggler_node.basis == "arrival"
    assert nodes.nodes[1].median_late_us == pytest.approx(3000)


def test_one_slow_rank_is_the_straggler_but_not_its_whole_node(tmp_path):
    a = _job(tmp_path)  # rank 3 alone is late; rank 2, on the same node, is not
    assert a.details.straggler.rank == 3
    assert a.details.nodes.straggler_node is None


def test_collectives_of_subgroups_not_named_in_the_trace_are_not_paired_across_ranks(tmp_path):
    # PGS lists subgroups; the NCCL kernels carry no group: the k-th all-reduce of rank 0 and of
    # rank 2 may be different groups' collectives, so no lateness, no straggler, and a note says why.
    a = _job(tmp_path, with_groups=True)
    pg = a.details.nodes.process_groups
    assert (pg.intra_node, pg.inter_node) == (2, 3)
    assert [g.span for g in pg.groups] == ["inter-node", "intra-node", "intra-node", "inter-node", "inter-node"]
    assert a.details.straggler is None and a.details.collectives_matched == 0
    assert "process group(s) smaller than the world" in a.details.collectives_unmatched_reason
    assert any("ranks are not compared at their collectives" in n for n in a.notes)


def test_a_node_clock_that_runs_ahead_is_found_and_taken_out(tmp_path):
    # Node 1's clock is 40 ms ahead: on raw times its ranks would arrive 40 ms late (or, with the
    # ends 40 ms apart, no rank would overlap another in a collective).
    a = _job(tmp_path, clock_us=40_000)
    nodes = a.details.nodes
    assert nodes.nodes[1].clock_offset_us == pytest.approx(40_000, abs=1)
    assert a.details.clocks_agree is True
    assert a.details.straggler.rank == 3 and a.details.straggler.median_late_us == pytest.approx(3000, abs=1)


def test_distinct_host_names_tell_nodes_apart_without_perfscopes_record(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    for r in range(4):
        _rank(d / f"rank{r}.json", r, 3_000, record=False, host=f"gpu-node-{7 - r // 2}")
    nodes = perfscope.analyze(d).details.nodes
    assert nodes.source == "host name"
    assert [(n.node, n.host, n.ranks) for n in nodes.nodes] == [(0, "gpu-node-7", [0, 1]),
                                                                            (1, "gpu-node-6", [2, 3])]


def test_one_host_and_no_record_is_no_node_view(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    for r in range(4):
        _rank(d / f"rank{r}.json", r, 3_000, record=False, host="vm")
    assert perfscope.analyze(d).details.nodes is None


def test_a_job_record_that_is_not_one_is_named_and_ignored(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    path = write_trace(d / "rank0.json", [step(1, 0, 100), cpu_op("aten::mm", 0, 90)],
                       **{JOB_KEY: {"version": 1, "node": {"node_rank": 5, "nnodes": 2, "local_rank": 0,
                                                           "local_world_size": 1}, "ddp": {"bucket_bytes": [-4]}}})
    a = perfscope.analyze(path)
    assert any("perfscope_job: its node is not four whole numbers in range; ignored" in w for w in a.warnings)
    assert any("perfscope_job: its DDP buckets are not a list of positive byte counts (at most 2**50 in all); ignored" in w for w in a.warnings)


def test_a_wait_for_communication_inside_an_operator_is_exposed_communication(tmp_path):
    # CPU trace: a 10 ms step; autograd's AccumulateGrad runs 2-9 ms and, inside it, the
    # hierarchical hook waits 3-8 ms for its collectives (perfscope.comm_wait); a gloo collective
    # runs on another thread 3-8 ms. The wait is not computation.
    from tracegen import annotation, event

    events = [step(1, 0, 10_000), cpu_op("aten::mm", 0, 2_000),
              cpu_op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 2_000, 7_000),
              annotation("perfscope.comm_wait", 3_000, 5_000),
              event("user_annotation", "gloo:all_reduce", 3_000, 5_000, tid=99)]
    row = perfscope.analyze(write_trace(tmp_path / "rank0.json", events)).steps.iloc[0]
    assert row["exposed_comm_us"] == pytest.approx(5_000)
    assert row["operator_us"] == pytest.approx(4_000)  # 0-2 and 2-3, 8-9 ms
    assert row["comm_us"] == pytest.approx(5_000)


def test_job_records_that_contradict_each_other_are_said(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    for r in range(4):
        path = _rank(d / f"rank{r}.json", r, 3_000)
        if r >= 2:  # ranks 2-3 say the job has 3 nodes, and put themselves on node 2
            text = path.read_text().replace('"nnodes": 2', '"nnodes": 3').replace('"node_rank": 1', '"node_rank": 2')
            path.write_text(text)
    a = perfscope.analyze(d)
    assert any("disagree on the number of nodes (2, 3)" in w for w in a.warnings), a.warnings
    assert any("rank(s) 2, 3 are not on the node" in w for w in a.warnings), a.warnings
    assert any("traces of 2 of the job's 3 nodes" in w for w in a.warnings), a.warnings


def test_comm_advice_of_a_job_over_nodes_puts_the_hierarchical_all_reduce_and_forecast_first(tmp_path):
    a = _job(tmp_path)
    assert a.details.facts.job.nnodes == 2 and a.details.facts.p2p_comm_share == 0.0
    advice = a.details.advice.comm
    assert advice.startswith("The job spans 2 nodes") and "hierarchical_allreduce" in advice
    assert "perfscope forecast" in advice and "bucket_cap_mb" in advice  # the usual knobs follow


@pytest.mark.parametrize("kernel, p2p", [("ncclDevKernel_SendRecv(ncclDevComm*)", True),
                                         ("ncclKernel_AllToAll_RING_LL_Sum_float", True),
                                         (NCCL_NEW, False)])
def test_comm_advice_names_point_to_point_traffic_when_it_is_most_of_the_communication(tmp_path, kernel, p2p):
    events = []
    for n in range(3):
        s = 10_000 * n
        # 2 ms of all-reduce, then 5 ms of the kernel under test
        events += [step(n + 1, s, 10_000), cpu_op("aten::mm", s, 9_500),
                   *launch(NCCL_NEW, s + 1, s + 10, 2_000, correlation=10 * n + 1, stream=20),
                   *launch(kernel, s + 2, s + 2_010, 5_000, correlation=10 * n + 2, stream=20)]
    a = perfscope.analyze(write_trace(tmp_path / "t.json", events))
    share = a.details.facts.p2p_comm_share
    assert share == pytest.approx(5 / 7 if p2p else 0.0)
    advice = a.details.advice.comm
    assert advice.startswith("Most communication time is point-to-point") is p2p
    assert ("bucket_cap_mb" in advice) is not p2p


# --- the script's DataLoader, as perfscope profile records it -----------------------------------


def _io_bound(tmp_path, loader):
    from tracegen import dataloader

    events = []
    for n in range(3):
        events += [step(n + 1, 1000 * n, 1000), dataloader(1000 * n, 800), cpu_op("aten::mm", 1000 * n + 810, 180)]
    meta = {JOB_KEY: {"version": 1, "node": None, "ddp": None, "loader": loader}}
    return perfscope.analyze(write_trace(tmp_path / "rank0.json", events, **meta))


def test_an_io_bound_run_whose_workers_meet_its_cores_is_told_to_cut_the_sample_cost(tmp_path):
    a = _io_bound(tmp_path, {"num_workers": 8, "prefetch_factor": 2, "persistent_workers": False,
                             "pin_memory": False, "batch_size": 16, "cores": 2})
    assert a.verdict.verdict == "io-bound"
    advice = a.verdict.advice
    assert advice.startswith("The DataLoader already has 8 workers for 2 core(s) a rank: more workers only share")
    assert "raise DataLoader num_workers" not in advice and "keep num_workers near 2" in advice
    assert a.summary()["details"]["facts"]["loader"]["num_workers"] == 8


def test_an_io_bound_run_with_fewer_workers_than_cores_is_told_to_raise_them(tmp_path):
    a = _io_bound(tmp_path, {"num_workers": 0, "cores": 4, "batch_size": "x"})
    assert a.verdict.advice.startswith("The DataLoader has 0 worker(s) for 4 core(s) a rank. Load data off the "
                                       "training thread: raise DataLoader num_workers")
    assert a.summary()["details"]["facts"]["loader"]["batch_size"] is None  # a field of the wrong type: dropped


def test_a_loader_record_out_of_range_is_refused_with_a_warning(tmp_path):
    a = _io_bound(tmp_path, {"num_workers": -1, "cores": 2})
    assert a.summary()["details"]["facts"]["loader"] is None
    assert "raise DataLoader num_workers" in a.verdict.advice
    assert any("its DataLoader is not a worker count and a core count in range; ignored" in w for w in a.warnings)


def test_the_job_watch_records_the_first_loader_the_script_iterates():
    import json

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from perfscope.collect.job_watch import JobWatch

    data = TensorDataset(torch.zeros(8, 2))
    with JobWatch() as watch:
        next(iter(DataLoader(data, batch_size=4)))
        next(iter(DataLoader(data, batch_size=2, pin_memory=True)))  # a second loader (validation): not it
    key, text = watch.header()
    loader = json.loads(text)["loader"]
    assert key == JOB_KEY and loader["num_workers"] == 0 and loader["batch_size"] == 4
    assert loader["pin_memory"] is False and loader["cores"] >= 1 and loader["prefetch_factor"] is None


@pytest.mark.parametrize("name, version", [("FSDP::all_gather (0)", 2), ("FullyShardedDataParallel.forward", 1)])
def test_an_fsdp_job_gets_fsdps_knobs_not_ddps(tmp_path, name, version):
    from tracegen import annotation

    events = []
    for n in range(3):
        events += [step(n + 1, 1000 * n, 1000), annotation(name, 1000 * n + 1, 10), cpu_op("aten::mm", 1000 * n + 20, 900)]
    a = perfscope.analyze(write_trace(tmp_path / "rank0.json", events))
    facts = a.summary()["details"]["facts"]
    comm = a.summary()["details"]["advice"]["comm"]
    assert facts["fsdp"] == version
    assert "bucket_cap_mb" not in comm and "shards with FSDP" in comm
    assert ("set_requires_gradient_sync" if version == 2 else "no_sync()") in comm


@pytest.mark.slow
def test_a_profiled_fsdp2_job_gets_fsdp_advice(tmp_path):
    import json

    from tunekit import ROOT, run_perfscope

    out = tmp_path / "out"
    done = run_perfscope("profile", "--nproc-per-node", "2", "--out", str(out),
                         str(ROOT / "tests" / "scripts" / "fsdp2_train.py"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["details"]["facts"]["fsdp"] == 2
    comm = summary["details"]["advice"]["comm"]
    assert comm.startswith("The job shards with FSDP2 (fully_shard)") and "bucket_cap_mb" not in comm
    if summary["overall"]["verdict"] == "comm-bound":
        assert summary["overall"]["advice"] == comm
    # the knob the tuner searches for it, applied at launch: the backward's all-gathers are gone
    (tmp_path / "keep.yaml").write_text("reshard_after_forward: false\n")
    kept = tmp_path / "kept"
    done = run_perfscope("profile", "--nproc-per-node", "2", "--out", str(kept), "--config", str(tmp_path / "keep.yaml"),
                         str(ROOT / "tests" / "scripts" / "fsdp2_train.py"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    applied = json.loads((kept / "summary.json").read_text())["run"]["config_applied"]["applied"]
    assert "reshard_after_forward=False" in applied["reshard_after_forward"]
    assert all_gathers(kept) * 2 == all_gathers(out) > 0


def all_gathers(out) -> int:
    """The all-gathers rank 0's trace holds (gloo's own ranges)."""
    import gzip
    import json

    with gzip.open(out / "traces" / "rank0.pt.trace.json.gz") as f:
        events = json.load(f)["traceEvents"]
    return sum(1 for e in events if e.get("ph") == "X" and e.get("name") == "gloo:all_gather")
