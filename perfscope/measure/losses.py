"""The mean loss of each measured step, from the loss tensors the recorder kept (for the tuner's
numerics guard, ``tuner/numerics.py``)."""

from __future__ import annotations


class _NoLosses:
    losses: dict = {}  # a step that kept nothing (its bucket was never made)


_NO_LOSSES = _NoLosses()


def loss_means(recorder, steps: int, torch) -> tuple[list[float | None], str | None]:
    """The mean loss of each step 1..``steps`` (None where none was seen) and where it was seen.

    ``perfscope.backward`` wins over plain ``backward()`` calls when a script has both. The
    tensors become floats here, all at once: one device sync, after the run.
    """
    kept = [recorder.buckets.get(step) or _NO_LOSSES for step in range(1, min(steps, recorder.last_step) + 1)]
    source = next((s for s in ("perfscope.backward", "autograd.backward") if any(b.losses.get(s) for b in kept)),
                  None)
    if source is None:
        return [None] * steps, None
    per_step = [b.losses.get(source, []) for b in kept]
    values = iter(_to_floats([t for tensors in per_step for t in tensors], torch))
    means: list[float | None] = []
    for tensors in per_step:
        known = [v for v in (next(values) for _ in tensors) if v is not None]
        means.append(sum(known) / len(known) if known else None)
    return means + [None] * (steps - len(means)), source


def _to_floats(tensors: list, torch) -> list[float | None]:
    """Python floats of scalar tensors: one device sync (one per item if they do not stack)."""
    if not tensors:
        return []
    try:
        return [float(v) for v in torch.stack([t.float().reshape(()) for t in tensors]).cpu().tolist()]
    except Exception:  # noqa: BLE001 - mixed devices: one by one
        out: list[float | None] = []
        for t in tensors:
            try:
                out.append(float(t.float().item()))
            except Exception:  # noqa: BLE001 - a device in an error state: that value is lost
                out.append(None)
        return out
