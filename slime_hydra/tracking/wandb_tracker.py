"""Weights & Biases, offline by default: the run is written under `<output_dir>/<logger.wandb_dir>` and leaves the
machine only with logger.wandb_mode=online (and a key in WANDB_API_KEY: tracking/checks.py), or by a later
`wandb sync` of that directory.

It gets what the MLflow tracker gets, already masked (config/redact.py): the composed config as params (W&B's run
config), the tags (config keys `tag/<name>`), the metrics by step and the artifacts (files of the run). What W&B
would gather by itself is turned off, since none of it passes through the masking: the command line and the
machine's description (`x_disable_meta`: an override's secret would sit in it), the console (`console=off`),
system metrics, git, code and the list of installed packages.

Steps: every metric is logged against `step` (W&B's `define_metric`), not W&B's own step counter, which drops a
point whose step is below the last one; points that tracking/retrying.py sends again after an outage, and the
points of a resumed run, keep their steps.

Left out: a sweep's parent run (tracking/sweep.py is MLflow's lineage; a job's W&B run stands alone, grouped by
logger.wandb_group), and logging from more than one process (slime's secondary ranks): the driver logs everything.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

STEP = "step"  # the metric every other one is plotted against


class WandbTracker:
    def __init__(self, project: str, run_name: str, save_dir: str, mode: str = "offline", team: Optional[str] = None,
                 group: Optional[str] = None, host: Optional[str] = None, resume_run_id: Optional[str] = None):
        import wandb  # kept out of every run that logs elsewhere (its import starts no service, but costs ~1 s)

        Path(save_dir).mkdir(parents=True, exist_ok=True)
        where = {"base_url": host} if host else {}  # None: W&B's cloud; the key stays in WANDB_API_KEY
        settings = wandb.Settings(mode=mode, console="off", x_disable_meta=True, x_disable_stats=True,
                                  x_disable_machine_info=True, disable_git=True, save_code=False,
                                  x_save_requirements=False, disable_job_creation=True, silent=True, **where)
        self.run = wandb.init(project=project, entity=team, group=group, name=run_name, dir=save_dir,
                              id=resume_run_id, resume="allow" if resume_run_id else None, settings=settings,
                              reinit="create_new")
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)
        self.run_id: str = self.run.id

    def log_params(self, params: dict[str, object]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.run.config.update({f"tag/{k}": str(v) for k, v in tags.items()}, allow_val_change=True)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log({**{k: float(v) for k, v in metrics.items()}, STEP: step})

    def log_artifact(self, path: str, artifact_path: Optional[str] = None) -> None:
        """A copy in the run's files (`files/<artifact_path>/<name>`), taken now: the file may change later."""
        dest = Path(self.run.dir) / (artifact_path or "") / Path(path).name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if Path(path).is_dir():
            shutil.copytree(path, dest, dirs_exist_ok=True)
        else:
            shutil.copyfile(path, dest)
        self.run.save(str(dest), base_path=self.run.dir, policy="now")  # a files record: `wandb sync` uploads it

    def close(self, status: str = "FINISHED") -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)

    def missing_report(self) -> str | None:
        """Nothing: a failed call raises here (the run's tracker is this one wrapped by tracking/retrying.py)."""
        return None
