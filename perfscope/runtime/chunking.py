"""The pipeline chunk of the hierarchical all-reduce's CPU path, apart from the hook so that the
forecast's cost model (which must not import torch) prices the same pipeline."""

# Pipeline chunk of the CPU path. Smaller chunks fill and drain the pipeline sooner; each costs
# every stage one collective's fixed latency (about 0.1-0.3 ms for gloo over loopback or a LAN).
# Measured on 2 emulated nodes x 2 ranks, 8 MiB at 200 Mbit/s (bench/bench_hierarchical.py): 4 MiB
# chunks reach 74% of the link bound, 1 MiB and 256 KiB chunks 89%.
CHUNK_BYTES = 1 << 20
