"""The collection layer of ``perfscope profile``: run a script under the profiler.

Importing this package does not import torch; :func:`collect` does.
See ``docs/collection.md`` for what a step is and how runs end.
"""

from perfscope.collect.api import collect, is_distributed_worker
from perfscope.collect.control import step
from perfscope.collect.errors import CollectError
from perfscope.collect.result import CollectResult
from perfscope.collect.schedule import ProfileSchedule
from perfscope.collect.traces import remove_stale_rank_traces, wait_for_rank_traces

__all__ = [
    "CollectError",
    "CollectResult",
    "ProfileSchedule",
    "collect",
    "is_distributed_worker",
    "remove_stale_rank_traces",
    "step",
    "wait_for_rank_traces",
]
