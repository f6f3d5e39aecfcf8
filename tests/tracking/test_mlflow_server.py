"""Remote tracking: two short embedded runs at once into a real `mlflow server` on loopback, read back over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.runs import FAST

pytestmark = pytest.mark.integration  # starts Ray, SGLang servers, megatron ranks or whole runs: not in `make test-fast`


def test_two_concurrent_runs_into_mlflow_server(mlflow_server, workdir):
    from mlflow.tracking import MlflowClient

    common = [*FAST, "eval=none", "num_rollout=2", f"logger.tracking_uri={mlflow_server}", "logger.mlflow_experiment=remote"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = {seed: subprocess.Popen([sys.executable, "-m", "slime_hydra", *common, f"seed={seed}",
                                     f"hydra.run.dir={workdir}/run{seed}"], cwd=workdir, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for seed in (1, 2)}  # both log to the one server at the same time
    for seed, p in procs.items():
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-4000:]
    assert not (workdir / "mlruns.db").exists()  # nothing went to the default local store

    client = MlflowClient(mlflow_server)
    runs = client.search_runs([client.get_experiment_by_name("remote").experiment_id])
    assert sorted(r.data.params["seed"] for r in runs) == ["1", "2"]
    for r in runs:
        seed = r.data.params["seed"]
        out_dir = workdir / f"run{seed}"
        summary = json.loads((out_dir / "summary.json").read_text())
        assert r.info.status == "FINISHED"
        # params: the whole composed config, flattened
        assert r.data.params["num_rollout"] == "2" and r.data.params["logger.tracking_uri"] == mlflow_server
        assert r.data.params["rollout.rollout_batch_size"] == "8" and r.data.params["algorithm.name"] == "grpo"
        # tags: what `run_info.json` holds
        info = json.loads((out_dir / "run_info.json").read_text())
        assert r.data.tags["git_sha"] == info["git_sha"] and r.data.tags["output_dir"] == str(out_dir)
        assert f"seed={seed}" in r.data.tags["overrides"] and r.data.tags["experiment_name"] == info["experiment_name"]
        # metrics: one point per rollout (steps 1, 2), none lost or doubled by the other run's writes
        for key in ("rollout/reward_mean", "rollout/response_len_mean", "train/grad_norm"):
            hist = client.get_metric_history(r.info.run_id, key)
            assert [m.step for m in hist] == [1, 2], key
            assert hist[-1].value == summary[key]["last"], key
        # artifacts: uploaded through the server's artifact proxy, readable back
        names = {a.path for a in client.list_artifacts(r.info.run_id)}
        assert {"composed_config.yaml", "summary.json", "reward_curve.png"} <= names
        local = client.download_artifacts(r.info.run_id, "summary.json", str(workdir / f"dl{seed}"))
        assert json.loads(open(local).read()) == summary


def test_experiment_created_once_when_many_runs_start_at_once(mlflow_server):
    """The race CI hit: two runs both find experiment `remote` missing and both create it; the loser's create
    failed with RESOURCE_ALREADY_EXISTS and the run died. Eight threads race here; all get the winner's id."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from mlflow.tracking import MlflowClient

    from slime_hydra.tracking.experiments import experiment_id

    names = [f"race{i}" for i in range(5)]
    for name in names:  # several rounds: a single round can miss the window
        barrier = Barrier(8)

        def start(_: int, name: str = name, barrier: Barrier = barrier) -> str:
            client = MlflowClient(tracking_uri=mlflow_server)
            barrier.wait(timeout=60)
            return experiment_id(client, name)

        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(start, range(8)))
        assert len(set(ids)) == 1, ids
        assert MlflowClient(tracking_uri=mlflow_server).get_experiment_by_name(name).experiment_id == ids[0]
