"""MLflow lineage for multirun sweeps: one parent run per sweep, one child run per job.

A Hydra callback creates the parent run in the driver when the sweep starts and writes its id into
the sweep directory; each job (in a Ray worker under `hydra/launcher=ray`, or in-process with the
basic launcher) reads it and opens its run as a child tagged with its overrides. When the sweep
ends, the callback reads the children back, prints a summary table (final metrics per job) and logs it
to the parent with the best job by `logger.sweep_rank_metric` and `logger.sweep_rank_direction`. Any
sweeper works (basic, `hydra/sweeper=optuna_maximize`): the callbacks see only the jobs' MLflow runs; an
Optuna sweep's `optimization_results.yaml` goes on the parent.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from slime_hydra.config.redact import redact_override
from slime_hydra.errors import ConfigError
from slime_hydra.tracking.experiments import experiment_id
from slime_hydra.tracking.store import open_client

PARENT_FILE = ".mlflow_parent_run_id"
RANK_KEY = "logger.sweep_rank_metric"
FALLBACK_METRIC = "rollout/reward_mean"  # ranks the jobs when none reported an eval accuracy


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
    # the driver's callbacks get the config with its hydra node, but no HydraConfig singleton
    return open_client(absolute_tracking_uri(config.logger.tracking_uri, str(config.hydra.runtime.cwd)))


class MlflowSweepCallback(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if config.logger.tracker != "mlflow":
            return
        # the parent run is created before the jobs start (tracking/store.py makes the schema once, under a lock)
        client = _client(config)
        exp_id = experiment_id(client, config.logger.mlflow_experiment)
        overrides = " ".join(map(redact_override, config.hydra.overrides.task))
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
        reported = {k for c in children for k in c.data.metrics}
        try:
            metric, problem = rank_metric(reported, config.logger.sweep_rank_metric), ""
        except ConfigError as e:  # the jobs' results still make a table, with no job marked best
            metric, problem = None, e.render()
        table, best = summary_table(children, metric, config.logger.sweep_rank_direction)
        print("\n" + table, flush=True)
        if problem:
            print(f"error: {problem}", file=sys.stderr, flush=True)
        path = Path(str(config.hydra.sweep.dir)) / "sweep_summary.md"
        path.write_text(table + (f"\n\n{problem}" if problem else "") + "\n")
        client.log_artifact(parent, str(path))
        optuna = path.with_name("optimization_results.yaml")  # the Optuna sweeper's best params and value
        if optuna.is_file():
            client.log_artifact(parent, str(optuna))
        client.log_batch(parent, tags=[_tag("best_run_id", best.info.run_id if best else "none"),
                                       _tag("rank_metric", metric or "none"), _tag("num_jobs", str(len(children)))])
        if best is not None and metric is not None:
            from mlflow.entities import Metric

            client.log_batch(parent, metrics=[Metric(f"sweep/best_{metric.replace('/', '_')}", best.data.metrics[metric], 0, 0)])
        client.set_terminated(parent, "FINISHED" if all(c.info.status == "FINISHED" for c in children) else "FAILED")


def _tag(k: str, v: str):
    from mlflow.entities import RunTag

    return RunTag(k, v)


def _eval_accuracy(key: str) -> bool:
    return key.startswith("eval/") and key.endswith("/accuracy")


def rank_metric(reported: set[str], named: Optional[str]) -> Optional[str]:
    """The metric the summary ranks jobs by, from the names the jobs reported: `named` (logger.sweep_rank_metric)
    when set, else the first eval/<set>/accuracy by name, else rollout/reward_mean; None when none of them was
    reported. A named metric that no job reported is a ConfigError naming the key and the nearest names."""
    evals = sorted(k for k in reported if _eval_accuracy(k))
    if named is None:
        return evals[0] if evals else FALLBACK_METRIC if FALLBACK_METRIC in reported else None
    if named in reported:
        return named
    hint = difflib.get_close_matches(named, sorted(reported), n=3, cutoff=0.5) or evals or sorted(reported)[:5]
    raise ConfigError([f"{RANK_KEY}={named!r} is a metric no job of the sweep reported, so no job is ranked best; "
                       f"set it to one they did ({', '.join(hint) or 'none reported'}), or null for the first "
                       "eval/<set>/accuracy"])


def summary_table(children, metric: Optional[str], direction: str) -> tuple[str, Any]:
    """A markdown table of each job's final metrics (`metric` first, then every eval accuracy and the mean reward
    the jobs reported) and the best job by `metric` (`direction`: max or min); None when no job reported it."""
    reported = {k for c in children for k in c.data.metrics}
    shown = sorted(k for k in reported if _eval_accuracy(k)) + [k for k in (FALLBACK_METRIC,) if k in reported]
    keys = ([metric] if metric else []) + [k for k in shown if k != metric]
    ordered = sorted(children, key=lambda c: c.data.tags.get("overrides", ""))
    scored = [c for c in ordered if metric and metric in c.data.metrics]
    pick = min if direction == "min" else max
    best = pick(scored, key=lambda c: c.data.metrics[metric]) if scored else None
    tokens = {c.info.run_id: c.data.tags.get("overrides", "").split() for c in children}
    common = set.intersection(*(set(t) for t in tokens.values())) if tokens else set()
    title = f"Jobs ranked by {metric} ({direction})" if metric else "Jobs not ranked: no metric to rank by"
    lines = [title, "", "| job overrides | status | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for c in ordered:
        vals = " | ".join(f"{c.data.metrics[k]:.4f}" if k in c.data.metrics else "-" for k in keys)
        mark = " (best)" if best is not None and c.info.run_id == best.info.run_id else ""
        swept = " ".join(t for t in tokens[c.info.run_id] if t not in common)  # what differs between jobs
        lines.append(f"| {swept}{mark} | {c.info.status} | {vals} |")
    return "\n".join(lines), best
