"""TensorBoard event files; params go in as one text summary."""

from __future__ import annotations


class TensorBoardTracker:
    run_id: str | None = None

    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=log_dir)

    def log_params(self, params):
        self.writer.add_text("params", "\n".join(f"{k}: {v}" for k, v in sorted(params.items())))

    def set_tags(self, tags):
        self.writer.add_text("tags", "\n".join(f"{k}: {v}" for k, v in sorted(tags.items())))

    def log_metrics(self, metrics, step):
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def log_artifact(self, path, artifact_path=None):
        pass

    def close(self, status="FINISHED"):
        self.writer.close()

    def missing_report(self) -> str | None:
        """Nothing: a failed call raises here (the run's tracker is this one wrapped by tracking/retrying.py)."""
        return None
