"""MLflow: the tracking store ``MLFLOW_TRACKING_URI`` names (MLflow's own default where unset),
through ``MlflowClient`` (the client API: no global active run is touched)."""

from __future__ import annotations

import time

from perfscope.export.base import Tracker, TrackerUnavailable
from perfscope.export.record import RunExport

# MLflow's batch limits (REST API LogBatch): 1000 metrics, 100 parameters, 100 tags a call.
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100
# MLflow's limit on a parameter's value (6000 characters since 2.x): longer ones are cut with a mark.
MAX_PARAM_CHARS = 6000


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


class MlflowTracker(Tracker):
    """Logs to MLflow: parameters, tags, step metrics, summary metrics (at step 0) and artifacts;
    children are runs tagged ``mlflow.parentRunId`` (MLflow's nested runs)."""

    name = "mlflow"
    extra = "perfscope-torch[mlflow]"

    def log(self, run: RunExport, *, experiment: str) -> str:
        try:
            from mlflow.entities import Metric, Param
            from mlflow.exceptions import MlflowException
            from mlflow.tracking import MlflowClient
            from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
        except ImportError:
            raise self.missing("mlflow") from None
        import logging

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its table set-up notes are not the user's news
        try:
            client = MlflowClient()
            found = client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found is not None else client.create_experiment(experiment)

            def one(r: RunExport, parent: str | None) -> str:
                tags = dict(r.tags, **({MLFLOW_PARENT_RUN_ID: parent} if parent else {}))
                created = client.create_run(experiment_id, tags=tags, run_name=r.name)
                rid = created.info.run_id
                now = int(time.time() * 1000)
                params = [Param(k, v if len(v) <= MAX_PARAM_CHARS else v[:MAX_PARAM_CHARS - 3] + "...")
                          for k, v in r.params.items()]
                metrics = [Metric(k, v, now, m.step) for m in r.steps for k, v in m.values.items()]
                metrics += [Metric(k, v, now, 0) for k, v in r.summary.items()]
                for part in _chunks(params, MAX_PARAMS):
                    client.log_batch(rid, params=part)
                for part in _chunks(metrics, MAX_METRICS):
                    client.log_batch(rid, metrics=part)
                for path in r.artifacts:
                    client.log_artifact(rid, path)
                for child in r.children:
                    one(child, rid)
                client.set_terminated(rid, "FINISHED")
                return rid

            run_id = one(run, None)
        except MlflowException as e:
            raise TrackerUnavailable(f"MLflow refused the run: {str(e).splitlines()[0]}") from None
        return f"MLflow run {run_id} in experiment {experiment!r} at {client.tracking_uri}"
