"""The null tracker and the factory (the Tracker Protocol: slime_hydra/protocols.py)."""

from __future__ import annotations

import os

from slime_hydra.config.schema import LoggerConfig
from slime_hydra.protocols import Tracker
from slime_hydra.tracking.retrying import RetryingTracker


class NullTracker:
    run_id: str | None = None

    def missing_report(self) -> str | None:
        return None

    def log_params(self, params):
        pass

    def set_tags(self, tags):
        pass

    def log_metrics(self, metrics, step):
        pass

    def log_artifact(self, path, artifact_path=None):
        pass

    def close(self, status="FINISHED"):
        pass


def build_tracker(cfg: LoggerConfig, run_name: str, output_dir: str, resume_run_id: str | None = None,
                  parent_run_id: str | None = None) -> Tracker:
    """The tracker of logger.tracker, its calls retried and their failures downgraded (tracking/retrying.py). A store
    that cannot be opened at all is a StoreError here, before the run starts."""
    if cfg.tracker == "mlflow":
        from slime_hydra.tracking.mlflow_tracker import MLflowTracker

        inner: Tracker = MLflowTracker(cfg.tracking_uri, cfg.mlflow_experiment, run_name, resume_run_id, parent_run_id,
                                       cfg.tracker_timeout_s)
    elif cfg.tracker == "tensorboard":
        from slime_hydra.tracking.tensorboard_tracker import TensorBoardTracker

        inner = TensorBoardTracker(os.path.join(output_dir, cfg.tensorboard_dir))
    elif cfg.tracker == "wandb":
        from slime_hydra.tracking.wandb_tracker import WandbTracker

        inner = WandbTracker(cfg.wandb_project, cfg.wandb_run_name or run_name, os.path.join(output_dir, cfg.wandb_dir),
                             cfg.wandb_mode, cfg.wandb_team, cfg.wandb_group, cfg.wandb_host, resume_run_id)
    else:
        return NullTracker()
    return RetryingTracker(inner, cfg.tracker_retries, cfg.tracker_retry_backoff_s)
