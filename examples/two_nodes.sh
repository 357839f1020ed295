#!/usr/bin/env bash
# A communication-bound DDP job on two emulated nodes (2 gloo ranks each) joined by a 200 Mbit/s
# link: profile it flat and with the hierarchical all-reduce, compare, tune it across both nodes,
# and forecast it from a one-node profile. Needs root (network namespaces, tc); run from the
# repository root with the environment active: examples/two_nodes.sh as root, or
# sudo -E env PATH="$PATH" examples/two_nodes.sh
# Everything goes to perfscope-out/two-nodes/; the emulated nodes are removed at the end.
set -euo pipefail
OUT=perfscope-out/two-nodes
RATE=${RATE:-200mbit}
MODEL=(--width 1024 --depth 2)  # 8 MiB of gradients: each step all-reduces them over the slow link
mkdir -p "$OUT"
printf 'hierarchical_allreduce: true\n' > "$OUT/hierarchical.yaml"
on_two_nodes() { python -m perfscope.emulate --nodes 2 --rate "$RATE" -- "$@"; }
JOB=(--nnodes 2 --node-rank '{node}' --rdzv-endpoint '{master}:29500' --nproc-per-node 2)

# 1. Profile on both nodes (the same command on each, as torchrun), then analyze the whole job.
on_two_nodes perfscope profile examples/comm_bound.py "${JOB[@]}" --out "$OUT/flat/node{node}" \
    -- "${MODEL[@]}" --steps 14
perfscope analyze "$OUT/flat" --out "$OUT/flat-job"
# 2. The same with the hierarchical all-reduce, and the two side by side.
on_two_nodes perfscope profile examples/comm_bound.py "${JOB[@]}" --config "$OUT/hierarchical.yaml" \
    --out "$OUT/hier/node{node}" -- "${MODEL[@]}" --steps 14
perfscope analyze "$OUT/hier" --out "$OUT/hier-job"
perfscope diff "$OUT/flat-job" "$OUT/hier-job" --out "$OUT/diff.html"
# 3. Tune across both nodes: node 0 drives the study, node 1 runs its ranks of every trial.
on_two_nodes perfscope tune examples/comm_bound.py "${JOB[@]}" --trials 4 --confirm-rounds 3 --no-progress \
    --out "$OUT/tune/node{node}" -- "${MODEL[@]}" --steps 1000
# 4. From a profile of one node, what would two and four nodes do on this link?
perfscope profile examples/comm_bound.py --nproc-per-node 2 --out "$OUT/one-node" -- "${MODEL[@]}" --steps 14
perfscope forecast "$OUT/one-node" --nodes 2 --ranks-per-node 2 --inter-node "$RATE" --out "$OUT/forecast-2"
perfscope forecast "$OUT/one-node" --nodes 4 --ranks-per-node 2 --inter-node "$RATE" --out "$OUT/forecast-4"
