"""What launch-time patching applied to a run (:func:`perfscope.runtime.patching.patched`)."""

from __future__ import annotations

import dataclasses

NEEDS_ACCELERATE = "needs perfscope.accelerate in the script"


@dataclasses.dataclass
class PatchReport:
    """What :func:`patched` applies.

    Attributes:
        applied: knob -> what it does at launch (only the knobs the configuration sets).
        needs_accelerate: knob -> why it was not applied (it needs ``perfscope.accelerate``, and
            the script has not applied it so far).
        not_applied: knob -> why a configured knob could not be patched (e.g. a missing module).
        loaders: DataLoaders the patch configured.
        ddp_modules: DistributedDataParallel wrappers the patch configured.
        by_accelerate: knob -> what ``perfscope.accelerate`` in the script applied.
    """

    applied: dict[str, str] = dataclasses.field(default_factory=dict)
    needs_accelerate: dict[str, str] = dataclasses.field(default_factory=dict)
    not_applied: dict[str, str] = dataclasses.field(default_factory=dict)
    loaders: int = 0
    ddp_modules: int = 0
    by_accelerate: dict[str, str] = dataclasses.field(default_factory=dict)

    def note_accelerated(self, applied: dict[str, str]) -> None:
        """Record what ``perfscope.accelerate`` applied in the script: those knobs no longer
        need it."""
        for key, what in applied.items():
            self.by_accelerate[key] = what
            self.needs_accelerate.pop(key, None)
        if "amp_level" in applied:  # the dtype comes with the level
            self.needs_accelerate.pop("amp_dtype", None)

    def to_dict(self) -> dict:
        """JSON-able copy (stored as ``run_info["config_applied"]``)."""
        return dataclasses.asdict(self)

    def needs_accelerate_line(self) -> str | None:
        """One line naming the knobs that need ``perfscope.accelerate``, or None."""
        if not self.needs_accelerate:
            return None
        from perfscope.runtime.config import KEYS

        keys = sorted(self.needs_accelerate, key=lambda k: KEYS.index(k) if k in KEYS else len(KEYS))
        return (f"perfscope: config knob(s) {', '.join(keys)} need perfscope.accelerate "
                "in the script (applied only if the script calls it)")
