"""Interval algebra on numpy arrays: unions, and lengths of boolean combinations of unions.

An *interval set* is a pair ``(starts, ends)`` of sorted, disjoint, non-empty half-open intervals
``[start, end)`` in integer nanoseconds. Unions use sort + running maximum (no Python loop over
events), so busy time over several streams is never counted twice and never exceeds the window.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Intervals(NamedTuple):
    """Sorted, disjoint, half-open intervals ``[starts[i], ends[i])`` in nanoseconds (int64)."""

    starts: np.ndarray
    ends: np.ndarray

    @property
    def total(self) -> int:
        """Covered length in nanoseconds."""
        return int((self.ends - self.starts).sum())

    def __len__(self) -> int:  # number of intervals
        return int(self.starts.shape[0])


EMPTY = Intervals(np.zeros(0, np.int64), np.zeros(0, np.int64))


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Union of possibly overlapping intervals.

    Args:
        starts, ends: 1-D int64 arrays of equal length (ns). Empty intervals (end <= start) are
            dropped.

    Returns:
        The union as an :class:`Intervals` (touching intervals are merged).
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new_group = np.empty(s.size, dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new_group)
    last = np.append(first[1:] - 1, s.size - 1)
    return Intervals(s[first], reach[last])


def clip(iv: Intervals, lo: int, hi: int) -> Intervals:
    """The part of ``iv`` inside ``[lo, hi)``."""
    if len(iv) == 0 or hi <= lo:
        return EMPTY
    i = np.searchsorted(iv.ends, lo, side="right")
    j = np.searchsorted(iv.starts, hi, side="left")
    s = np.maximum(iv.starts[i:j], lo)
    e = np.minimum(iv.ends[i:j], hi)
    keep = e > s
    return Intervals(s[keep], e[keep])


def covers(iv: Intervals, points: np.ndarray) -> np.ndarray:
    """True where ``points`` (ns) lie inside ``iv`` (half-open)."""
    if len(iv) == 0:
        return np.zeros(np.shape(points), dtype=bool)
    return (np.searchsorted(iv.starts, points, side="right") - np.searchsorted(iv.ends, points, side="right")) > 0


class Segments(NamedTuple):
    """A window cut at every boundary of some interval sets.

    ``lengths[k]`` is the length (ns) of elementary segment ``k``; ``member[j, k]`` tells whether
    segment ``k`` lies inside set ``j``. Any boolean formula over the rows gives the exact length
    of that combination: e.g. ``lengths[member[0] & ~member[1]].sum()``.
    """

    lengths: np.ndarray
    member: np.ndarray


def segments(sets: list[Intervals], lo: int, hi: int) -> Segments:
    """Cut ``[lo, hi)`` into elementary segments and record which sets cover each.

    Args:
        sets: Interval sets (ns).
        lo, hi: The window (ns).

    Returns:
        :class:`Segments` with ``member`` of shape ``(len(sets), n_segments)``.
    """
    clipped = [clip(s, lo, hi) for s in sets]
    edges = np.unique(np.concatenate([np.array([lo, hi], np.int64)] + [c.starts for c in clipped] + [c.ends for c in clipped]))
    left = edges[:-1]
    member = np.stack([covers(c, left) for c in clipped]) if sets else np.zeros((0, left.size), bool)
    return Segments(np.diff(edges), member)


def outermost(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Which ranges are not nested in (nor overlapped by) an earlier one.

    Args:
        starts, ends: ``(n,)`` the ranges, sorted by start.

    Returns:
        ``(n,)`` bool: True where the range starts at or after every earlier range's end.
    """
    reach = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(ends)[:-1]])
    return starts >= reach


def locate(points: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index of the span ``[starts[i], ends[i])`` holding each point; -1 if none.

    The spans must be sorted and disjoint (step windows are). int64 result, one per point.
    """
    if starts.size == 0:
        return np.full(np.shape(points), -1, dtype=np.int64)
    # in place: one int64 array per point, the large allocation of a large trace's analysis
    idx = np.searchsorted(starts, points, side="right").astype(np.int64, copy=False)
    idx -= 1
    outside = idx < 0
    idx[outside] = 0
    outside |= points >= ends[idx]
    idx[outside] = -1
    return idx


class WindowSegments(NamedTuple):
    """Many windows cut at every boundary of some interval sets, in one pass.

    ``lengths[k]`` (ns) and ``window[k]`` (index of the window holding it) of elementary segment
    ``k``; ``member[j, k]`` tells whether it lies inside set ``j``; ``left[k]`` is where it starts.
    ``per_window(mask)`` sums lengths per window, so any boolean formula over the rows gives every
    window's length of that combination at once.
    """

    lengths: np.ndarray
    member: np.ndarray
    window: np.ndarray
    n_windows: int
    left: np.ndarray

    def pieces(self, mask: np.ndarray) -> Intervals:
        """The segments in ``mask`` as an interval set (adjacent ones merged)."""
        return union(self.left[mask], self.left[mask] + self.lengths[mask])

    def per_window(self, mask: np.ndarray) -> np.ndarray:
        """Total length (ns, float) of the segments in ``mask``, one entry per window."""
        return np.bincount(self.window[mask], weights=self.lengths[mask], minlength=self.n_windows)


def window_segments(sets: list[Intervals], starts: np.ndarray, ends: np.ndarray) -> WindowSegments:
    """Cut every window ``[starts[i], ends[i])`` (sorted, disjoint) into elementary segments.

    Linear in the number of intervals and windows (one sort), where cutting each window on its
    own would cost windows x intervals.
    """
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    # Every boundary once, sorted. A large trace has tens of millions of boundaries, so each step
    # below makes one array of them and frees the last (np.unique would sort a copy of its input).
    edges = np.concatenate([starts, ends] + [s.starts for s in sets] + [s.ends for s in sets])
    edges.sort()
    distinct = np.ones(edges.size, bool)
    np.not_equal(edges[1:], edges[:-1], out=distinct[1:])
    edges = edges[distinct]
    del distinct
    window = locate(edges[:-1], starts, ends)
    keep = window >= 0
    left = edges[:-1][keep]
    lengths = edges[1:][keep]
    del edges
    lengths -= left
    # window indices fit int32 (a trace has far fewer than 2**31 steps): 4 bytes a segment less
    window = window[keep].astype(np.int32) if starts.size < 2**31 else window[keep]
    del keep
    member = np.stack([covers(s, left) for s in sets]) if sets else np.zeros((0, left.size), bool)
    return WindowSegments(lengths, member, window, int(starts.size), left)
