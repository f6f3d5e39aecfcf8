"""`ray job submit -- slime-hydra experiment=...` against a `ray start --head` cluster on loopback.

The job's driver runs under the cluster's job supervisor and tracks into the real `mlflow server`. Both
cases are slow (the local one ~35 s; run by hand: `pytest -q -m slow tests/e2e/test_ray_job.py`): one submits the
embedded default (one process), the other the Ray-path experiment, whose driver joins the cluster through
RAY_ADDRESS and builds its 2-rank + 2-engine placement group there (the same path orchestration/test_ray_backend.py runs
in-process, in the default tier).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from tests.support.runs import FAST
from tests.support.servers import BIN

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`

LOCAL = "grpo/qwen3-tiny-addition-cpu-local-torch-v1"
RAY = "grpo/qwen3-tiny-addition-cpu-ray-dp2-torch-v1"


@pytest.mark.slow  # keeps the default tier under 15 minutes; the Ray path itself is tested in orchestration/test_ray_backend.py
@pytest.mark.parametrize("experiment", [LOCAL, RAY])
def test_ray_job_submit_short_run_succeeds(ray_head, mlflow_server, tmp_path, experiment):
    from mlflow.tracking import MlflowClient
    from ray.job_submission import JobStatus, JobSubmissionClient

    out = tmp_path / "job"  # absolute: the job's working directory is the cluster's, not ours
    job_id = f"slime-hydra-{uuid.uuid4().hex[:8]}"
    entry = [sys.executable, "-m", "slime_hydra", f"experiment={experiment}", *FAST, "eval=none", "num_rollout=2",
             f"logger.tracking_uri={mlflow_server}", f"logger.mlflow_experiment=ray_job_{job_id}", f"hydra.run.dir={out}"]
    proc = subprocess.run([str(BIN / "ray"), "job", "submit", "--address", ray_head.dashboard_url, "--submission-id", job_id,
                           "--", *entry], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    jobs = JobSubmissionClient(ray_head.dashboard_url)
    assert jobs.get_job_status(job_id) == JobStatus.SUCCEEDED
    logs = jobs.get_job_logs(job_id)
    assert "rollout/reward_mean" in logs  # the run's summary table, printed by the job's driver
    summary = json.loads((out / "summary.json").read_text())
    assert json.loads((out / "run_info.json").read_text())["experiment_name"] == experiment

    client = MlflowClient(mlflow_server)
    (run,) = client.search_runs([client.get_experiment_by_name(f"ray_job_{job_id}").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["output_dir"] == str(out)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/reward_mean")] == [1, 2]
    assert run.data.metrics["rollout/reward_mean"] == summary["rollout/reward_mean"]["last"]
    if experiment == LOCAL:
        assert run.data.params["cluster.backend"] == "local"
        return
    assert run.data.params["cluster.backend"] == "ray" and run.data.params["cluster.actor_num_gpus_per_node"] == "2"
    for rank in (0, 1):  # the rank actors on the cluster log into the driver's run by run id, over HTTP
        assert [m.step for m in client.get_metric_history(run.info.run_id, f"perf/rank{rank}_train_time_s")] == [1, 2]
