"""The collection layer of ``perfscope profile``: run a script under the profiler.

Importing this package does not import torch; :func:`collect` does.
See ``docs/collection.md`` for what a step is and how runs end.
"""

# Each name loads its module on first use, so that a light submodule (the schedule's limits, which
# the command line needs) does not bring the whole collection layer with it.
_HOME = {"collect": "perfscope.collect.api", "is_distributed_worker": "perfscope.collect.api",
         "CollectError": "perfscope.collect.errors",
         "CollectResult": "perfscope.collect.result", "NodeLaunch": "perfscope.collect.nodes", "ProfileSchedule": "perfscope.collect.schedule",
         "remove_stale_rank_traces": "perfscope.collect.traces", "wait_for_rank_traces": "perfscope.collect.traces"}

__all__ = [
    "CollectError",
    "CollectResult",
    "NodeLaunch",
    "ProfileSchedule",
    "collect",
    "is_distributed_worker",
    "remove_stale_rank_traces",
    "wait_for_rank_traces",
]


def __getattr__(name: str):
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'perfscope.collect' has no attribute {name!r}")
