"""The CPU (gloo) path of the hierarchical all-reduce: its three stages pipelined over chunks,
every collective issued from the thread that runs DDP's hook.

Each chunk of a bucket goes through an intra-node reduce-scatter (an all-to-all and a local sum:
gloo's reduce-scatter gives no future), an inter-node all-reduce of its shard and an intra-node
all-gather, each stage on a process group of its own. All are asynchronous: gloo runs them on its
groups' worker threads. Each group must see the same sequence of collectives on every rank, so
each stage issues its chunks strictly in their global order (hook call order, then chunk order),
whatever the timing.

Who issues the later stages: the thread running the hook, never a thread of perfscope's own or a
future's callback. The profiler records only collectives issued from a profiled thread (gloo
carries the profiler's range from the issuing thread to its worker); issued elsewhere they would
be missing from the trace, and a profile would call a communication-bound step launch-bound.
So every hook call first issues what the finished stages allow without waiting (:meth:`poll`),
and the call for the last bucket of the backward pass (``GradBucket.is_last()``; DDP waits for
all buckets right after it anyway) drives the pipeline to the end, waiting on the oldest
collective whenever nothing can be issued.
"""

# No ``from __future__ import annotations`` (the hook module's rule: DDP inspects annotations).
import collections
import dataclasses

import torch
import torch.distributed as dist

from perfscope.trace.kinds import COMM_WAIT_RANGE

# torch >= 2.13 renamed the tensor collectives; the old names still work but warn.
reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclasses.dataclass(eq=False)
class _Bucket:
    padded: torch.Tensor
    numel: int
    out: torch.Tensor
    pending: int
    fut: torch.futures.Future = dataclasses.field(default_factory=torch.futures.Future)


@dataclasses.dataclass(eq=False)
class _Chunk:
    chunk: torch.Tensor
    shard: torch.Tensor
    recv: torch.Tensor  # the L pieces of this rank's shard, one from each rank of the node
    bucket: _Bucket
    work: object = None  # the collective of its current stage


class ChunkPipeline:
    """The chunks in flight, stage by stage (module docstring).

    Args:
        intra, gather, inter: This rank's reduce-scatter, all-gather and inter-node groups.
        local_world_size: Ranks per node (a chunk is a multiple of it).
    """

    def __init__(self, intra, gather, inter, local_world_size: int) -> None:
        self._intra, self._gather, self._inter = intra, gather, inter
        self._L = local_world_size
        # Chunks whose reduce-scatter, all-reduce, all-gather is in flight, oldest first.
        self._stages: tuple[collections.deque, ...] = (collections.deque(), collections.deque(), collections.deque())

    def submit(self, padded: torch.Tensor, numel: int, out: torch.Tensor, chunk_numel: int,
               last: bool) -> torch.futures.Future:
        """Start reducing ``padded`` (1-D, a multiple of L long) over the world in chunks of
        ``chunk_numel`` values; the future resolves to ``out`` holding ``padded[:numel]``.
        ``last``: the backward pass's last bucket, after which the pipeline is driven to the end."""
        starts = range(0, padded.numel(), chunk_numel)
        bucket = _Bucket(padded=padded, numel=numel, out=out, pending=len(starts))
        if not starts:  # nothing to reduce
            bucket.fut.set_result(out)
            if last:
                self.poll(block=True)  # earlier buckets still finish now
            return bucket.fut
        try:
            for start in starts:
                chunk = padded[start:start + chunk_numel]
                item = _Chunk(chunk, torch.empty(chunk.numel() // self._L, dtype=chunk.dtype), torch.empty_like(chunk),
                              bucket)
                item.work = dist.all_to_all_single(item.recv, item.chunk, group=self._intra, async_op=True)
                self._stages[0].append(item)
            if last:
                # The training thread waits for communication here, inside autograd's operator:
                # the range tells the analysis so (perfscope.analysis.partition).
                with torch.profiler.record_function(COMM_WAIT_RANGE):
                    self.poll(block=True)
            else:
                self.poll()
        except BaseException as exc:  # noqa: BLE001 - every waiting bucket learns of it
            self._fail(exc)
            if not bucket.fut.done():
                bucket.fut.set_exception(exc)
        return bucket.fut

    def poll(self, block: bool = False) -> None:
        """Issue every stage whose predecessor finished; with ``block``, wait until all are done."""
        rs, ar, ag = self._stages
        while rs or ar or ag:
            moved = False
            while rs and rs[0].work.is_completed():
                item = rs.popleft()
                item.work.wait()  # re-raises a failed collective
                torch.sum(item.recv.view(self._L, -1), dim=0, out=item.shard)
                item.work = dist.all_reduce(item.shard, group=self._inter, async_op=True)
                ar.append(item)
                moved = True
            while ar and ar[0].work.is_completed():
                item = ar.popleft()
                item.work.wait()
                item.work = all_gather(item.chunk, item.shard, group=self._gather, async_op=True)
                ag.append(item)
                moved = True
            while ag and ag[0].work.is_completed():
                item = ag.popleft()
                item.work.wait()
                self._chunk_done(item.bucket)
                moved = True
            if not moved:
                if not block:
                    return
                # Nothing to issue: wait for the oldest collective of the earliest stage, whose end
                # lets the next one be issued.
                (rs or ar or ag)[0].work.wait()

    @staticmethod
    def _chunk_done(bucket: _Bucket) -> None:
        bucket.pending -= 1
        if bucket.pending:
            return
        if bucket.out.data_ptr() != bucket.padded.data_ptr():
            bucket.out.copy_(bucket.padded[:bucket.numel])  # decompress or unpad
        bucket.fut.set_result(bucket.out)

    def _fail(self, exc: BaseException) -> None:
        for stage in self._stages:
            for item in stage:
                if not item.bucket.fut.done():
                    item.bucket.fut.set_exception(exc)
            stage.clear()
