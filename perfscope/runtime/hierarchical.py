"""Hierarchical all-reduce: a DDP communication hook that reduces inside each node first.

What the hook does to a gradient bucket of ``S`` bytes, with ``L`` ranks per node and ``N``
nodes (world size ``W = N * L``, ranks numbered node by node as torchrun does):

1. divide the bucket by ``W`` (once, before any communication, so fp16 cannot overflow);
2. **intra-node reduce-scatter**: the ``L`` ranks of a node sum their buckets and each keeps one
   ``1/L`` shard of the node's sum (the bucket is zero-padded to a multiple of ``L``);
3. **inter-node all-reduce** of that shard among the ``N`` ranks with the same local rank, one
   group per local rank: afterwards every shard holds the sum over the whole world;
4. **intra-node all-gather** of the ``L`` shards, so every rank ends with the full averaged
   bucket, the same as a flat all-reduce gives (up to floating-point summation order).

Why it helps: only step 3 crosses nodes. It runs among ``N`` ranks instead of ``W``, so a ring
all-reduce takes ``2(N-1)`` latency-bound steps instead of ``2(W-1)``, and each rank sends
``2(N-1)/N * S/L`` bytes over the inter-node link instead of ``2(W-1)/W * S``: ``L`` times fewer
per rank, carried by ``L`` independent groups in parallel (one per NIC on multi-rail nodes).
Steps 2 and 4 use the fast intra-node links (NVLink, shared memory).

When the world is a single node (``L == W``) or every rank is its own node (``L == 1``) there
is nothing to split, and the hook is a plain all-reduce over the world group (which is then
the intra-node group, respectively the inter-node group).

How the collectives are issued. Every rank must issue the same sequence of collectives on
each subgroup, so nothing may depend on which collective happens to finish first (chaining
them through future callbacks would):

* **GPU tensors (NCCL)**: the hook issues steps 2, 3 and 4 itself, in bucket order; steps 2
  and 3 with ``async_op=False``, which with NCCL only orders them on the GPU stream and does
  not block the host. DDP waits on step 4's future.
* **CPU tensors (gloo)**: a blocking gloo collective would stop the backward pass for the whole
  exchange, and the three steps of a bucket would run one after the other while the links of
  the other two stay idle. Instead the bucket is cut into chunks of at most ``chunk_bytes`` and
  the three steps run as a pipeline (:mod:`perfscope.runtime.hier_pipeline`): every collective
  is asynchronous, each stage has its own process group (the all-gather an intra-node group of
  its own) and takes its chunks in one order on every rank. While chunk ``k`` crosses the slow
  inter-node link, chunk ``k + 1`` is reduced and chunk ``k - 1`` gathered inside the node. The
  hook issues what it can at every bucket and drives the rest at the last bucket of the
  backward pass, from the backward thread, so that the profiler records every collective.
  With ``C`` chunks the exchange takes about ``max(stage) * C + (sum of the other stages) / C``
  instead of the sum of the three.
"""

# No ``from __future__ import annotations``: DDP compares the hook's annotations with the real
# ``dist.GradBucket`` / ``Future[Tensor]`` objects and rejects strings.
import os

import torch
import torch.distributed as dist

from perfscope.runtime.chunking import CHUNK_BYTES
from perfscope.runtime.hier_pipeline import ChunkPipeline, all_gather, reduce_scatter

LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"  # set by torchrun: ranks on this node


def resolve_local_world_size(local_world_size: int | None = None) -> int:
    """The number of ranks per node: the explicit value, else ``$LOCAL_WORLD_SIZE``.

    Args:
        local_world_size: Ranks per node; ``None`` reads the environment (set by torchrun).

    Returns:
        The ranks per node (>= 1).

    Raises:
        ValueError: Neither is given, or the value is not a positive integer.
    """
    source = "local_world_size"
    if local_world_size is None:
        raw = os.environ.get(LOCAL_WORLD_SIZE_ENV)
        if raw is None:
            raise ValueError(
                f"hierarchical_allreduce needs the ranks per node: set {LOCAL_WORLD_SIZE_ENV} "
                "(torchrun does) or pass local_world_size"
            )
        source = f"${LOCAL_WORLD_SIZE_ENV}"
        try:
            local_world_size = int(raw)
        except ValueError:
            raise ValueError(f"{source} must be a positive integer, got {raw!r}") from None
    if isinstance(local_world_size, bool) or not isinstance(local_world_size, int) or local_world_size < 1:
        raise ValueError(f"{source} must be a positive integer, got {local_world_size!r}")
    return local_world_size


class HierarchicalAllReduce:
    """State of the hierarchical all-reduce hook: the node layout and its process subgroups.

    Constructing it is a collective call: every rank must construct it, in the same order
    relative to other group creations, because ``torch.distributed.new_group`` must be called
    by all ranks for every group. Each rank therefore creates all ``N`` intra-node groups and
    all ``L`` inter-node groups and keeps the two it belongs to.

    Attributes:
        world_size: Ranks in the default group (``W``).
        local_world_size: Ranks per node (``L``).
        num_nodes: ``W // L``.
        node: This rank's node index (``rank // L``).
        local_rank: This rank's index within its node (``rank % L``).
        compress_dtype: ``torch.float16`` or ``torch.bfloat16`` to communicate the bucket in
            that precision (compress, reduce hierarchically, decompress), or ``None``.
        flat: True when the layout has nothing to split (``L == 1`` or ``L == W``).
        intra_group: This node's group (``None`` when flat).
        gather_group: A second group of this node's ranks, for the all-gathers of the CPU
            pipeline (``None`` when flat).
        inter_group: The group of ranks sharing this local rank (``None`` when flat).
        chunk_bytes: Largest chunk of the CPU pipeline, in bytes.
    """

    def __init__(
        self, local_world_size: int | None = None, *, compress_dtype: torch.dtype | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ):
        """Checks the layout and creates the subgroups.

        Args:
            local_world_size: Ranks per node; ``None`` reads ``$LOCAL_WORLD_SIZE``.
            compress_dtype: ``torch.float16``, ``torch.bfloat16`` or ``None``.
            chunk_bytes: Largest chunk of the CPU pipeline, in bytes (>= 1024).

        Raises:
            RuntimeError: No default process group is initialised.
            ValueError: The ranks per node are unknown or not a positive integer, the world size
                is not a multiple of them, ``$LOCAL_RANK`` disagrees with ``rank % L`` while
                ``L`` is ``$LOCAL_WORLD_SIZE`` (ranks not numbered node by node), ``compress_dtype``
                is not a 16-bit float, or ``chunk_bytes`` is below 1024.
        """
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("HierarchicalAllReduce needs an initialised default process group")
        if compress_dtype not in (None, torch.float16, torch.bfloat16):
            raise ValueError(
                f"compress_dtype must be torch.float16, torch.bfloat16 or None, got {compress_dtype}"
            )
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1024:
            raise ValueError(f"chunk_bytes must be an integer >= 1024, got {chunk_bytes!r}")
        self.compress_dtype = compress_dtype
        self.chunk_bytes = chunk_bytes
        self._chunks: ChunkPipeline | None = None
        self.local_world_size = resolve_local_world_size(local_world_size)
        self.world_size = dist.get_world_size()
        rank = dist.get_rank()
        if self.world_size % self.local_world_size:
            raise ValueError(
                f"hierarchical_allreduce: world size {self.world_size} is not a multiple of "
                f"local_world_size {self.local_world_size} (ranks per node)"
            )
        self.num_nodes = self.world_size // self.local_world_size
        self.node, self.local_rank = divmod(rank, self.local_world_size)
        env_local_rank = os.environ.get("LOCAL_RANK", "")
        env_layout = os.environ.get(LOCAL_WORLD_SIZE_ENV) == str(self.local_world_size)
        if env_layout and env_local_rank.isdigit() and int(env_local_rank) != self.local_rank:
            # The groups below assume node-contiguous ranks; anything else would reduce
            # across the wrong ranks "within a node" and silently lose the benefit. (An
            # explicit layout unlike the launcher's is taken as given.)
            raise ValueError(
                f"hierarchical_allreduce: rank {rank} has LOCAL_RANK {env_local_rank} but rank % "
                f"local_world_size is {self.local_rank}; ranks must be numbered node by node"
            )
        self.flat = self.local_world_size in (1, self.world_size)
        self.intra_group = self.gather_group = self.inter_group = None
        if self.flat:
            return
        L, W = self.local_world_size, self.world_size
        for attr in ("intra_group", "gather_group"):
            for node in range(self.num_nodes):
                group = dist.new_group(ranks=list(range(node * L, (node + 1) * L)))
                if node == self.node:
                    setattr(self, attr, group)
        for local in range(L):
            group = dist.new_group(ranks=list(range(local, W, L)))
            if local == self.local_rank:
                self.inter_group = group

    def allreduce(self, tensor: torch.Tensor, last: bool = True) -> torch.futures.Future:
        """Average ``tensor`` (1-D, contiguous) over the world, in place, node by node.

        What the hook does with a bucket's buffer; usable on any flat tensor (benchmarks).

        Args:
            tensor: The local values; overwritten with the world average.
            last: No more calls come before the result is waited for (DDP's last bucket of the
                backward pass): on CPU, the pipeline of chunks is driven to the end now.
                With False the future completes only at a later call with ``last=True``:
                waiting on it before that never returns.

        Returns:
            A future of ``tensor`` once it holds the average (an exception if a collective failed).
        """
        # Divide before communicating, as PyTorch's own hooks do, so fp16 sums cannot overflow.
        # ``.to`` returns ``tensor`` itself when no compression is asked for (in place, no copy).
        work = tensor.to(self.compress_dtype or tensor.dtype).div_(self.world_size)
        if self.flat:
            return _then_copy(dist.all_reduce(work, async_op=True).get_future(), work, tensor)
        L = self.local_world_size
        numel = work.numel()
        padded_numel = -(-numel // L) * L  # ceil to a multiple of L, in integers
        if padded_numel == numel:
            padded = work
        else:
            padded = torch.zeros(padded_numel, dtype=work.dtype, device=work.device)
            padded[:numel].copy_(work)
        if work.device.type != "cpu":
            shard = torch.empty(padded_numel // L, dtype=work.dtype, device=work.device)
            reduce_scatter(shard, padded, group=self.intra_group)
            dist.all_reduce(shard, group=self.inter_group)
            # ``padded`` was consumed by the reduce-scatter above, so it can receive the gather.
            gathered = all_gather(padded, shard, group=self.intra_group, async_op=True).get_future()
            return _then_copy(gathered, padded[:numel], tensor)
        if self._chunks is None:
            self._chunks = ChunkPipeline(self.intra_group, self.gather_group, self.inter_group, L)
        chunk = max(L, self.chunk_bytes // padded.element_size() // L * L)
        return self._chunks.submit(padded, numel, tensor, chunk, last)


def _then_copy(fut: torch.futures.Future, result: torch.Tensor, out: torch.Tensor) -> torch.futures.Future:
    def finish(done: torch.futures.Future) -> torch.Tensor:
        done.value()  # re-raises a failed collective
        if result.data_ptr() != out.data_ptr():
            out.copy_(result)  # decompress or unpad, in place to keep peak memory low
        return out

    return fut.then(finish)


def hierarchical_allreduce_hook(
    state: HierarchicalAllReduce, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average ``bucket`` over the world, node by node.

    Register with ``ddp.register_comm_hook(HierarchicalAllReduce(...), hierarchical_allreduce_hook)``.
    See the module docstring for the exact steps.

    Args:
        state: The layout and subgroups (created once, on every rank).
        bucket: The gradient bucket DDP hands over.

    Returns:
        A future of the bucket's flat buffer holding the world average, in the buffer's dtype.
    """
    return state.allreduce(bucket.buffer(), last=bucket.is_last())
