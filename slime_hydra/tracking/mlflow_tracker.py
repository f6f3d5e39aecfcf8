"""MLflow tracking through `MlflowClient` (no global active-run state, so several runs can coexist).

The store is opened by tracking/store.py (a sqlite store's schema made once under a lock, a broken store named).
Against a tracking server each request gives up after `timeout_s` with no retries of MLflow's own (by default
7 retries with backoff, minutes per call against a server that is down): tracking/retrying.py retries, then
turns a failure into a warning, so a tracker outage never stops the run.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag

from slime_hydra.tracking.experiments import experiment_id
from slime_hydra.tracking.store import open_client

MAX_PARAM_LEN = 6000


def mlflow_key(name: str) -> str:
    """MLflow rejects '@' in names: `eval/x/pass@4` is stored as `eval/x/pass_at_4`."""
    return name.replace("@", "_at_")


def artifact_root(tracking_uri: str, experiment: str) -> str | None:
    """Where a new experiment's artifacts go. For a sqlite store: `mlruns/<experiment>/` beside the database file,
    so a run's artifacts stay with its metrics wherever the process runs (MLflow's own default is
    `./mlruns/<experiment id>/` in the current directory). Other stores (a tracking server) decide: None."""
    if not tracking_uri.startswith("sqlite:///"):
        return None
    db = Path(tracking_uri[len("sqlite:///"):]).resolve()
    return (db.parent / "mlruns" / re.sub(r"[^A-Za-z0-9._-]", "_", experiment)).as_uri()


class MLflowTracker:
    def __init__(self, tracking_uri: str, experiment: str, run_name: str, resume_run_id: str | None = None,
                 parent_run_id: str | None = None, timeout_s: float = 10.0):
        if tracking_uri.startswith(("http://", "https://")):  # read by MLflow at each request (module docstring)
            os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, round(timeout_s)))
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        self.client = open_client(tracking_uri)
        exp_id = experiment_id(self.client, experiment, artifact_root(tracking_uri, experiment))
        if resume_run_id:
            self.run_id = resume_run_id
            self.client.update_run(resume_run_id, status="RUNNING")
        else:
            tags = {"mlflow.parentRunId": parent_run_id} if parent_run_id else None
            self.run_id = self.client.create_run(exp_id, run_name=run_name, tags=tags).info.run_id

    def log_params(self, params: dict[str, object]) -> None:
        items = [Param(k, str(v)[:MAX_PARAM_LEN]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)[:MAX_PARAM_LEN]) for k, v in tags.items()])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        ts = int(time.time() * 1000)
        items = [Metric(mlflow_key(k), float(v), ts, step) for k, v in metrics.items()]
        for i in range(0, len(items), 500):
            self.client.log_batch(self.run_id, metrics=items[i : i + 500])

    def log_artifact(self, path: str, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, path, artifact_path)

    def close(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)

    def missing_report(self) -> str | None:
        """Nothing: a failed call raises here (the run's tracker is this one wrapped by tracking/retrying.py)."""
        return None
