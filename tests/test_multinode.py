"""Multi-node behaviour on an emulated cluster (perfscope.emulate): 2 nodes x 2 gloo ranks.
Needs root: skipped with the reason elsewhere, failed under CI (where root is given)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from perfscope.emulate import EmulatedCluster, LinkShape
from emulated import root_cluster_host, torchrun  # noqa: F401 - a fixture

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.usefixtures("root_cluster_host")


def test_hierarchical_ddp_matches_flat_and_sends_a_third_fewer_bytes_between_nodes():
    with EmulatedCluster(2, LinkShape(rate="1gbit")) as cluster:
        done = cluster.run([torchrun(cluster, i, SCRIPTS / "ddp_two_nodes.py") for i in range(2)], timeout_s=180)
    assert [d.returncode for d in done] == [0, 0], [d.stderr[-6000:] for d in done]
    r = json.loads([line for line in done[0].stdout.splitlines() if line.startswith("{")][-1])
    assert r["max_diff"] <= 1e-5 * r["max_grad"], r  # the same average, up to summation order
    size, n, g = r["grad_bytes"], 2, 2
    # What crosses the link from node 0, against the ring formulas (plus TCP/IP headers): flat, the
    # ring of all 4 ranks crosses it once each way, 2(NG-1)/NG * S; hierarchical, the 2 inter-node
    # groups together 2(N-1)/N * S.
    flat, hier = 2 * (n * g - 1) / (n * g) * size, 2 * (n - 1) / n * size
    assert 0.99 * flat <= r["flat_tx"] <= 1.12 * flat, (r, flat)
    assert 0.99 * hier <= r["hier_tx"] <= 1.12 * hier, (r, hier)


HIER = "hierarchical_allreduce: true\n"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "comm_bound.py"
SECRET = "the-two-node-jobs-secret-0123456789"  # the board's endpoint is not loopback: signed records
MODEL = ["--width", "1024", "--depth", "2"]  # 8 MiB of gradients: 0.4-0.6 s a step at 200 Mbit/s


def _perfscope(cluster, node: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "perfscope", *[a.replace("{node}", str(node)) for a in args]]


def _lines(done) -> str:
    return "\n".join(f"node {i}: {d.stdout[-1500:]} {d.stderr[-1500:]}" for i, d in enumerate(done))


def test_a_two_node_profile_is_analyzed_by_node_with_the_hierarchical_hooks_communication(tmp_path):
    (tmp_path / "hier.yaml").write_text(HIER)
    with EmulatedCluster(2, LinkShape(rate="200mbit")) as cluster:
        endpoint = f"{cluster.addresses[0]}:29521"
        done = cluster.run([_perfscope(cluster, i, "profile", str(EXAMPLE), "--nnodes", "2", "--node-rank", "{node}",
                                       "--rdzv-endpoint", endpoint, "--nproc-per-node", "2", "--config",
                                       str(tmp_path / "hier.yaml"), "--out", str(tmp_path / "job" / "node{node}"),
                                       "--", *MODEL, "--steps", "14") for i in range(2)], timeout_s=300)
    assert [d.returncode for d in done] == [0, 0], _lines(done)
    # Each node analyzed its own ranks, and said how to see the whole job.
    for i, d in enumerate(done):
        assert f"node {i} of 2: this summary covers ranks {2 * i}-{2 * i + 1}" in d.stdout, d.stdout
        traces = sorted(p.name for p in (tmp_path / "job" / f"node{i}" / "traces").iterdir())
        ranks = (2 * i, 2 * i + 1)  # each rank's trace and its whole-run record, and nothing else
        assert traces == sorted([f"rank{r}.pt.trace.json.gz" for r in ranks] + [f"rank{r}.run.jsonl" for r in ranks])
    # The hook's collectives are in the traces: the step is communication-bound, not launch- or
    # compute-bound from a training thread that seems to idle or compute while it waits.
    assert "verdict: comm-bound" in done[0].stdout, done[0].stdout
    import perfscope

    a = perfscope.analyze(tmp_path / "job")  # every node's traces, gathered under one folder
    assert a.verdict.verdict == "comm-bound"
    nodes = a.details.nodes
    assert nodes.source == "perfscope" and [n.ranks for n in nodes.nodes] == [[0, 1], [2, 3]]
    link = nodes.link
    assert link.algorithm == "hierarchical" and link.comm_hook == "hierarchical_allreduce_hook"
    # 2(N-1)/N * S through each node's link, carried at no more than the shaped rate
    assert link.inter_node_bytes_per_step == pytest.approx(link.gradient_bytes)
    assert all(0 < r <= 200e6 * 1.05 for r in link.achieved_bits_per_s.values()), link
    groups = nodes.process_groups
    assert groups.intra_node >= 2 and groups.inter_node >= 2, groups  # the hook's subgroups


@pytest.mark.slow
def test_tuning_on_two_nodes_runs_every_trial_on_both_and_picks_the_hierarchical_all_reduce_on_a_slow_link(tmp_path):
    with EmulatedCluster(2, LinkShape(rate="200mbit")) as cluster:
        endpoint = f"{cluster.addresses[0]}:29531"
        done = cluster.run([_perfscope(cluster, i, "tune", str(EXAMPLE), "--nnodes", "2", "--node-rank", "{node}",
                                       "--rdzv-endpoint", endpoint, "--nproc-per-node", "2", "--trials", "3",
                                       "--steps-per-trial", "3", "--warmup-steps", "1", "--confirm-rounds", "3",
                                       "--confirm-top", "1", "--no-progress", "--out", str(tmp_path / "node{node}"),
                                       "--", *MODEL, "--steps", "1000") for i in range(2)], timeout_s=600,
                           env={**os.environ, "PERFSCOPE_BOARD_SECRET": SECRET})
    assert [d.returncode for d in done] == [0, 0], _lines(done)
    record = json.loads((tmp_path / "node0" / "tune.json").read_text())
    assert not (tmp_path / "node1" / "tune.json").exists()  # one result, written by node 0
    runs = re.search(r"node 1: (\d+) run\(s\) of node 0's done", done[1].stdout)
    # baseline, 2 trials, 2 or 3 rounds of 2, the after-profile. Up to three rounds, not two: with two,
    # the 95% interval's t factor is 12.7, and rounds of 1.38x and 1.29x gave 0.88x-2.04x, "keep current"
    assert runs and int(runs.group(1)) >= 6, done[1].stdout
    assert "hierarchical_allreduce" in [k["name"] for k in record["space"]["searched"]], record["space"]
    # Whether it is proven faster is a measurement (bench/bench_hierarchical.py: 1.50x at 200 Mbit/s):
    # here, the study ends in a recommendation that says what it found, and a faster one is the knob.
    rec = record["recommendation"]
    assert rec["status"] in ("faster", "keep-current") and rec["line"], rec
    assert rec["status"] != "faster" or rec["config"].get("hierarchical_allreduce") is True, rec


@pytest.mark.slow
def test_two_independent_two_node_jobs_share_one_postgresql_study(tmp_path, postgres_url, postgres_socket_url):
    """Two jobs of 2 nodes each (one rank per node), the same command on every node, one study in
    PostgreSQL: each job's node 0 is a worker of the shared search, its other node follows its
    trials, and each job writes its own result."""
    import optuna

    from storagekit import study_name
    from perfscope.tuner.storage import open_storage

    name, jobs = study_name(), {"a": 0, "b": 2}  # each job's first node
    with EmulatedCluster(4, LinkShape(rate="1gbit")) as cluster:
        cmds = []
        for job, first in jobs.items():
            endpoint = f"{cluster.addresses[first]}:29541"
            for rank in (0, 1):
                cmds.append(_perfscope(cluster, rank, "tune", str(EXAMPLE), "--nnodes", "2", "--node-rank", str(rank),
                                       "--rdzv-endpoint", endpoint, "--nproc-per-node", "1", "--trials", "5",
                                       "--steps-per-trial", "2", "--warmup-steps", "1", "--confirm-rounds", "2",
                                       "--confirm-top", "1", "--no-progress", "--storage", postgres_socket_url,
                                       "--study-name", name, "--out", str(tmp_path / job / f"node{rank}"),
                                       "--", "--width", "256", "--depth", "2", "--steps", "1000"))
        done = cluster.run(cmds, timeout_s=600, env={**os.environ, "PERFSCOPE_BOARD_SECRET": SECRET})
    assert [d.returncode for d in done] == [0, 0, 0, 0], _lines(done)
    password = postgres_socket_url.split(":")[2].split("@")[0]
    assert password not in "".join(d.stdout + d.stderr for d in done)
    for job in jobs:
        assert (tmp_path / job / "node0" / "tune.json").exists()  # one result per job, by its node 0
        assert not (tmp_path / job / "node1" / "tune.json").exists()
    for i in (1, 3):  # every follower ran its job's baseline or its trials, and the confirmation
        assert re.search(r"node 1: [1-9]\d* run\(s\) of node 0's done", done[i].stdout), done[i].stdout
    study = optuna.load_study(storage=open_storage(postgres_url, tmp_path), study_name=name)
    workers = {t.user_attrs["worker"]["pid"] for t in study.trials if "worker" in t.user_attrs}
    assert len(workers) == 2, [t.user_attrs for t in study.trials]  # both jobs ran trials of the one search
    assert len(study.trials) >= 5 and all(t.state.is_finished() for t in study.trials), study.trials
    records = [json.loads((tmp_path / job / "node0" / "tune.json").read_text()) for job in jobs]
    assert records[0]["study"]["name"] == records[1]["study"]["name"] == name, [r.get("study") for r in records]
    for r in records:  # the storage is recorded with its password masked
        assert "***@/" in r["study"]["storage"] and password not in json.dumps(r), r["study"]
