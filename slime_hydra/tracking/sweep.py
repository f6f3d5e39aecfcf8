"""MLflow lineage for multirun sweeps: one parent run per sweep, one child run per job.

A Hydra callback creates the parent run in the driver when the sweep starts and writes its id into
the sweep directory; each job (in a Ray worker under `hydra/launcher=ray`, or in-process with the
basic launcher) reads it and opens its run as a child tagged with its overrides. When the sweep
ends, the callback reads the children back and logs a summary table (final metrics per job, best
job) to the parent and prints it. Any sweeper works (basic, `hydra/sweeper=optuna_maximize`): the
callbacks see only the jobs' MLflow runs; an Optuna sweep's `optimization_results.yaml` goes on the parent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from slime_hydra.tracking.experiments import experiment_id

PARENT_FILE = ".mlflow_parent_run_id"
SUMMARY_METRICS = ("eval/addition/accuracy", "rollout/reward_mean")


def absolute_tracking_uri(uri: str, cwd: str) -> str:
    """`sqlite:///mlruns.db` is relative to where the command ran, not to a Ray worker's directory."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        return prefix + str(Path(cwd) / uri[len(prefix):])
    return uri


def parent_run_id(sweep_dir: str) -> Optional[str]:
    p = Path(sweep_dir) / PARENT_FILE
    return p.read_text().strip() if p.is_file() else None


def _client(config: DictConfig):
    from mlflow.tracking import MlflowClient

    # the driver's callbacks get the config with its hydra node, but no HydraConfig singleton
    uri = absolute_tracking_uri(config.logger.tracking_uri, str(config.hydra.runtime.cwd))
    return MlflowClient(tracking_uri=uri)


class MlflowSweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.logger.tracker != "mlflow":
            return
        # creating the parent here also creates the store's tables once, before concurrent jobs open it
        client = _client(config)
        exp_id = experiment_id(client, config.logger.mlflow_experiment)
        overrides = " ".join(config.hydra.overrides.task)
        run = client.create_run(exp_id, run_name=f"sweep:{config.experiment_name}",
                                tags={"sweep": "parent", "overrides": overrides or "(none)",
                                      "experiment_name": config.experiment_name})
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        (sweep_dir / PARENT_FILE).write_text(run.info.run_id)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        parent = parent_run_id(str(config.hydra.sweep.dir))
        if parent is None:
            return
        client = _client(config)
        exp_id = client.get_run(parent).info.experiment_id
        children = client.search_runs([exp_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent}'")
        table, best = summary_table(children)
        print("\n" + table, flush=True)
        path = Path(str(config.hydra.sweep.dir)) / "sweep_summary.md"
        path.write_text(table + "\n")
        client.log_artifact(parent, str(path))
        optuna = path.with_name("optimization_results.yaml")  # the Optuna sweeper's best params and value
        if optuna.is_file():
            client.log_artifact(parent, str(optuna))
        client.log_batch(parent, tags=[_tag("best_run_id", best.info.run_id if best else "none"),
                                       _tag("num_jobs", str(len(children)))])
        if best is not None:
            from mlflow.entities import Metric

            key = _score_key(best)
            client.log_batch(parent, metrics=[Metric(f"sweep/best_{key.replace('/', '_')}", best.data.metrics[key], 0, 0)])
        client.set_terminated(parent, "FINISHED" if all(c.info.status == "FINISHED" for c in children) else "FAILED")


def _tag(k: str, v: str):
    from mlflow.entities import RunTag

    return RunTag(k, v)


def _score_key(run) -> str:
    return next((k for k in SUMMARY_METRICS if k in run.data.metrics), next(iter(sorted(run.data.metrics)), ""))


def summary_table(children) -> tuple[str, Any]:
    keys = [k for k in SUMMARY_METRICS if any(k in c.data.metrics for c in children)]
    scored = [c for c in children if keys and keys[0] in c.data.metrics]
    best = max(scored, key=lambda c: c.data.metrics[keys[0]]) if scored else None
    tokens = {c.info.run_id: c.data.tags.get("overrides", "").split() for c in children}
    common = set.intersection(*(set(t) for t in tokens.values())) if tokens else set()
    lines = ["| job overrides | status | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for c in sorted(children, key=lambda c: c.data.tags.get("overrides", "")):
        vals = " | ".join(f"{c.data.metrics[k]:.4f}" if k in c.data.metrics else "-" for k in keys)
        mark = " (best)" if best is not None and c.info.run_id == best.info.run_id else ""
        swept = " ".join(t for t in tokens[c.info.run_id] if t not in common)  # what differs between jobs
        lines.append(f"| {swept}{mark} | {c.info.status} | {vals} |")
    return "\n".join(lines), best
