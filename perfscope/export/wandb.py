"""Weights & Biases: a run per record, online where the machine is logged in (or ``WANDB_MODE``
says so), offline otherwise (a run folder under ``WANDB_DIR`` that ``wandb sync`` uploads later)."""

from __future__ import annotations

import os

from perfscope.export.base import Tracker, TrackerUnavailable
from perfscope.export.record import RunExport


def _mode() -> str:
    """``WANDB_MODE`` where set, else online with an API key, else offline."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class WandbTracker(Tracker):
    """Logs to W&B: parameters as the run's config, tags as config ``tags/...`` and W&B tags
    (``key:value``), step metrics with ``step=``, summary values in the run's summary, artifacts as
    one artifact of type ``perfscope``; children are runs in the parent's group (W&B has no nested
    runs)."""

    name = "wandb"
    extra = "perfscope-torch[wandb]"

    def log(self, run: RunExport, *, experiment: str) -> str:
        try:
            import wandb
        except ImportError:
            raise self.missing("wandb") from None
        mode = _mode()
        where = []

        def one(r: RunExport, group: str | None) -> str:
            config = dict(r.params, **{f"tags/{k}": v for k, v in r.tags.items()})
            labels = [f"{k.removeprefix('perfscope.')}:{v}"[:64] for k, v in r.tags.items()]
            try:
                w = wandb.init(project=experiment, name=r.name, config=config, tags=labels, group=group,
                               job_type="perfscope", mode=mode, reinit="create_new", settings=wandb.Settings(silent=True))
            except Exception as e:  # noqa: BLE001 - wandb raises its own and plain errors alike
                raise TrackerUnavailable(f"W&B could not start a run: {str(e).splitlines()[0]}") from None
            try:
                for m in r.steps:
                    w.log(dict(m.values), step=m.step)
                w.summary.update(dict(r.summary))
                if r.artifacts:
                    artifact = wandb.Artifact(f"{r.name}-outputs".replace(" ", "-"), type="perfscope")
                    for path in r.artifacts:
                        artifact.add_file(path)
                    w.log_artifact(artifact)
                where.append(os.path.dirname(w.dir))  # the run folder (w.dir is its files/)
                return w.id
            finally:
                w.finish()

        try:
            run_id = one(run, None)
            for child in run.children:
                one(child, run_id)
        finally:
            # Waits until W&B's service has written (or sent) every run: finish() alone may return
            # before the last run's records reach its folder on a busy machine.
            wandb.teardown()
        return f"W&B run {run_id} in project {experiment!r} ({mode}; {where[0]})"
