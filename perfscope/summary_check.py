"""Checking a summary record before it is rendered: the types of the fields the report, the
comparison and the terminal read, and that every number is finite.

A hand-edited or damaged ``summary.json`` then gives one "malformed summary" line naming the field,
instead of a failure deep inside a report section.
"""

from __future__ import annotations

import math
import re

from perfscope.text import short_repr

# What the renderers and the terminal rely on, checked once at load, so a hand-edited summary is
# one "malformed summary" line instead of a failure deep inside a report section. A field that is
# absent is allowed (older summaries lack some); one that is present must have its type.
_MAX_NUMBER = 2.0**63  # beyond any microsecond count or nanosecond epoch; keeps arithmetic finite
_TOKEN = re.compile(r"[A-Za-z0-9_.+-]{1,40}")


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _share(v) -> bool:
    return _num(v) and -1e-6 <= v <= 1 + 1e-6  # rounding may pass the bounds by a hair


_RULES = {  # name -> (test, what it must be)
    "text": (lambda v: v is None or isinstance(v, str), "text or null"),
    "token": (lambda v: v is None or (isinstance(v, str) and _TOKEN.fullmatch(v) is not None),
              "a class name such as io-bound, or null"),
    "int": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)), "a whole number or null"),
    "num": (lambda v: v is None or _num(v), "a number or null"),
    "number": (_num, "a number"),
    "nonneg": (lambda v: v is None or (_num(v) and v >= 0), "a number >= 0 or null"),
    "bool": (lambda v: v is None or isinstance(v, bool), "true, false or null"),
    "dict": (lambda v: v is None or isinstance(v, dict), "an object or null"),
    "list": (lambda v: v is None or isinstance(v, list), "a list or null"),
    "share": (lambda v: v is None or _share(v), "a fraction from 0 to 1, or null"),
    "numlist": (lambda v: v is None or (isinstance(v, list) and all(_num(x) or x is None for x in v)),
                "a list of numbers"),
    "texts": (lambda v: v is None or (isinstance(v, list) and all(isinstance(x, str) for x in v)), "a list of text"),
}
# section -> field -> rule; "*_us" and the like apply to every other field with that ending, "*" to all
_FIELDS = {
    "": {"mode": "token", "generated_at": "text", "run": "dict", "overall": "dict", "details": "dict",
         "steps": "list", "traces": "list", "skipped": "list", "data_quality": "list", "notes": "texts",
         "warnings": "texts"},
    "run": {"world_size": "int", "ranks_analyzed": "int", "source": "text", "script": "text"},
    "overall": {"verdict": "token", "runner_up": "token", "reason": "text", "advice": "text", "other_largest": "bool",
                "provisional": "bool", "core_wait_share": "share",
                "fractions": "dict", "step_share": "dict", "steps_by_status": "dict", "steps_counted": "int",
                "steps_total": "int", "median_step_time_us": "nonneg", "mean_step_time_us": "nonneg",
                "step_time_us": "nonneg", "representative_step": "int"},
    "steps": {"rank": "int", "step": "int", "verdict": "token", "runner_up": "token", "status": "text",
              "provisional_verdict": "token",
              "status_reason": "text", "worker": "text", "mode": "token", "counted": "bool", "complete": "bool",
              "*_us": "num", "*_cost_frac": "share", "*_frac": "num", "*_count": "num", "*_bytes": "nonneg",
              "step_time_us": "nonneg"},
    "overall.fractions": {"*": "share"},
    "overall.step_share": {"*": "share"},
    "overall.steps_by_status": {"*": "num"},
    "details": {"what_if": "list", "top_kernels": "list", "memcpy": "list", "ranks": "list", "straggler": "dict",
                "nodes": "dict", "memory": "dict",
                "slowest_rank": "int", "idle_gaps": "dict", "other_waits": "dict", "launch_stats": "dict",
                "advice": "dict", "facts": "dict", "host_cpu": "dict"},
    "details.host_cpu": {"cores": "int", "training_process": "share", "workers": "share", "others": "share",
                         "cause": "text"},
    "details.memory": {"kind": "token", "ranks": "list", "near_limit": "bool", "peak_bytes": "nonneg",
                       "capacity_bytes": "nonneg", "headroom_bytes": "num", "*_share": "num", "problems": "texts"},
    "details.what_if": {"class": "token", "speedup": "num", "*_us": "num"},
    "details.top_kernels": {"name": "text", "count": "num", "share": "share", "*_us": "num"},
    "details.memcpy": {"direction": "text", "pageable": "bool", "count": "num", "bytes": "num", "*_us": "num",
                       "gb_per_s": "num"},
    "details.launch_stats": {"*": "num"},
    "details.ranks": {"rank": "int", "*_us": "num"},
    "details.straggler": {"rank": "int", "steps": "int", "steps_last": "int", "basis": "text", "*_us": "num"},
    "details.nodes": {"source": "text", "count": "int", "nodes": "list", "straggler_node": "dict",
                      "process_groups": "dict", "link": "dict", "problems": "texts"},
    "details.nodes.link": {"gradient_bytes": "num", "buckets": "int", "comm_hook": "text", "algorithm": "text",
                           "inter_node_bytes_per_step": "num", "achieved_bits_per_s": "dict", "slowest_link_node": "int"},
    "details.nodes.link.achieved_bits_per_s": {"*": "num"},
    "details.nodes.nodes": {"node": "int", "host": "text", "ranks": "numlist", "*_us": "num"},
    "details.nodes.straggler_node": {"node": "int", "rank": "int", "basis": "text"},
    "details.nodes.process_groups": {"groups": "list", "intra_node": "int", "inter_node": "int"},
    "details.nodes.process_groups.groups": {"name": "text", "desc": "text", "size": "int", "span": "text"},
    "details.idle_gaps": {"edges_us": "numlist", "count": "numlist", "total_us": "numlist"},
    "details.other_waits": {"other_idle_us": "num", "causes": "dict"},
    "data_quality": {"action": "text", "reason": "text", "unit": "text", "count": "num", "traces": "num",
                     "examples": "dict"},
    "data_quality.examples": {"*": "number"},
    "traces": {"path": "text", "fingerprint": "text", "worker": "text", "rank": "int", "world_size": "int", "mode": "text", "events": "num"},
    "skipped": {"path": "text", "reason": "text", "damaged": "bool"},
}
_LISTS_OF_OBJECTS = {"steps", "traces", "skipped", "data_quality", "details.what_if", "details.top_kernels",
                     "details.memcpy", "details.ranks", "details.nodes.nodes", "details.nodes.process_groups.groups"}


def _bad_number(value, where: str) -> str | None:
    """The first non-finite or absurdly large number anywhere in ``value``, as a message."""
    stack = [(value, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, dict):
            stack += [(x, f"{at}.{k}" if at else str(k)) for k, x in v.items()]
        elif isinstance(v, list):
            stack += [(x, f"{at}[{i}]") for i, x in enumerate(v)]
        elif _num(v) and not (math.isfinite(v) and abs(v) <= _MAX_NUMBER):
            return f"{at}: {short_repr(v)} is out of range"
    return None


def _check_object(obj: dict, section: str, at: str) -> str | None:
    rules = _FIELDS.get(section, {})
    for key, value in obj.items():
        rule = rules.get(key) or next((r for pat, r in rules.items() if pat[0] == "*" and str(key).endswith(pat[1:])),
                                      None)
        field = f"{at}.{key}" if at else str(key)
        if rule is not None:
            test, what = _RULES[rule]
            if not test(value):
                return f"{field}: expected {what}, got {short_repr(value, 40)}"
        sub = f"{section}.{key}" if section else str(key)
        if isinstance(value, dict) and sub in _FIELDS:
            problem = _check_object(value, sub, field)
            if problem:
                return problem
        elif isinstance(value, list) and sub in _LISTS_OF_OBJECTS:
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    return f"{field}[{i}]: expected an object, got {short_repr(item, 40)}"
                problem = _check_object(item, sub, f"{field}[{i}]")
                if problem:
                    return problem
    return None


def summary_problem(summary: dict) -> str | None:
    """What is wrong with a summary record's fields, or None when the renderers can use it.

    Checks the types of the fields the report, the comparison and the terminal output read (a
    number where a number belongs, a list of objects where rows belong, a class name where a
    verdict belongs) and that every number is finite and below 2**63.

    Args:
        summary: A record as read from ``summary.json``.

    Returns:
        ``"FIELD: expected ..., got ..."`` naming the first bad field, or None.
    """
    return _check_object(summary, "", "") or _bad_number(summary, "")
