"""A node's part of a multi-node job: the options checked, the rendezvous endpoint parsed, and the
ranks' check that every node was started with the same ranks."""

from __future__ import annotations

import pytest

from perfscope.collect.errors import CollectError
from perfscope.collect.nodes import NodeLaunch, check_layout, from_options
from perfscope.errors import PerfscopeError
from conftest import HANG_TIMEOUT_S  # noqa: E402


@pytest.mark.parametrize("endpoint, host, port", [("node0:29500", "node0", 29500), ("10.0.0.1:1", "10.0.0.1", 1),
                                                  ("[fe80::1]:29500", "fe80::1", 29500)])
def test_endpoints_are_host_and_port(endpoint, host, port):
    assert NodeLaunch(nnodes=2, node_rank=1, rdzv_endpoint=endpoint).host_port() == (host, port)


@pytest.mark.parametrize("endpoint", ["node0", "node0:", ":29500", "h:0", "h:65536", "h:\u00b2", "h:\u0663\u0663",
                                      "::1", "fe80::1:29500", "a b:29500", " :29500"])
def test_an_endpoint_that_is_not_host_and_port_is_refused(endpoint):
    with pytest.raises(CollectError, match="HOST:PORT"):
        NodeLaunch(nnodes=2, node_rank=0, rdzv_endpoint=endpoint)


def test_the_options_go_together():
    assert from_options(None, None, None, None) is None and from_options(1, None, None, 2) is None
    with pytest.raises(CollectError, match="missing --node-rank, --rdzv-endpoint"):
        from_options(2, None, None, 2)
    with pytest.raises(CollectError, match="--nproc-per-node"):
        from_options(2, 0, "h:1", None)
    with pytest.raises(CollectError, match="--node-rank must be a whole number from 0 to 1"):
        from_options(2, 2, "h:1", 2)


def test_a_rank_refuses_a_world_that_is_not_the_nodes_times_its_ranks():
    check_layout({"PERFSCOPE_NNODES": "2", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    check_layout({"WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "1"})  # not perfscope's multi-node launch
    with pytest.raises(CollectError, match="3 ranks, not 2 nodes x 1: every node must be started with the same"):
        check_layout({"PERFSCOPE_NNODES": "2", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "1"})


def test_the_tuning_board_refuses_a_port_without_room_for_its_runs():
    from perfscope.tuner.nodes import TrialBoard

    with pytest.raises(PerfscopeError, match="the 50 ports above it"):
        TrialBoard(NodeLaunch(nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:65500"), 2)


NODE0 = """
import os, sys
from perfscope.collect.nodes import NodeLaunch
from perfscope.tuner.nodes import TrialBoard
board = TrialBoard(NodeLaunch(nnodes=2, node_rank=0, rdzv_endpoint=sys.argv[1]), 1)
print("serving", flush=True)
sys.stdin.readline()  # the follower is waiting for trial 0
board.stop()
os._exit(0)  # at once, as node 0 does once it has written its results
"""
FOLLOWER = """
import sys
from perfscope.collect.nodes import NodeLaunch
from perfscope.tuner.nodes import follow
sys.exit(follow(NodeLaunch(nnodes=2, node_rank=1, rdzv_endpoint=sys.argv[1]), 1, "train.py", setup_timeout_s=30))
"""


def test_a_follower_reads_the_stop_of_a_node_0_that_exits_right_after_it(tmp_path):
    """Node 0 serves the board; a stop it set just before exiting must still reach the others."""
    import socket
    import subprocess
    import sys

    port = 65535
    while port > 65485:  # the board refuses ports without 50 free above them
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    endpoint = f"127.0.0.1:{port}"
    node0 = subprocess.Popen([sys.executable, "-c", NODE0, endpoint], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert node0.stdout.readline().strip() == "serving"
        follower = subprocess.Popen([sys.executable, "-c", FOLLOWER, endpoint], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        assert "following node 0's trials" in follower.stdout.readline()
        node0.stdin.write("go\n")
        node0.stdin.flush()
        out, err = follower.communicate(timeout=HANG_TIMEOUT_S)
        assert follower.returncode == 0, err
        assert "0 run(s) of node 0's done" in out, out
        assert node0.wait(timeout=30) == 0
    finally:
        node0.kill()
