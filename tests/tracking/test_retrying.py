"""A tracker outage never stops the run (tracking/retrying.py): calls are retried, then downgraded to a warning; the
points not logged are sent again once the tracker works, and those still missing are reported. Through a real run: an
`mlflow server` killed mid-run, the run finishes with every checkpoint written and the missing points named."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from slime_hydra.tracking.retrying import RetryingTracker, steps_text
from tests.support.runs import FAST, start_cli


class Flaky:
    """A tracker that fails while `down` is set, recording what it logged."""

    run_id = "r"

    def __init__(self):
        self.down, self.logged, self.calls, self.closed = False, [], 0, None

    def _maybe_fail(self):
        self.calls += 1
        if self.down:
            raise ConnectionError("connection refused")

    def log_metrics(self, metrics, step):
        self._maybe_fail()
        self.logged.append(step)

    def log_params(self, params):
        self._maybe_fail()

    def set_tags(self, tags):
        self._maybe_fail()

    def log_artifact(self, path, artifact_path=None):
        self._maybe_fail()

    def close(self, status="FINISHED"):
        self._maybe_fail()
        self.closed = status

    def missing_report(self):
        return None


def test_an_outage_is_retried_then_skipped_and_its_points_sent_again(caplog):
    inner, sleeps = Flaky(), []
    t = RetryingTracker(inner, retries=2, backoff_s=1.0, sleep=sleeps.append)
    t.log_metrics({"a": 1.0}, 1)
    inner.down = True
    t.log_metrics({"a": 2.0}, 2)  # 1 + 2 retries, backoff 1 s then 2 s
    assert sleeps == [1.0, 2.0] and inner.calls == 4
    t.log_metrics({"a": 3.0}, 3)  # still down: one try, no backoff
    t.log_artifact("x")
    assert sleeps == [1.0, 2.0] and inner.calls == 6
    assert [s for s, _ in t.missing] == [2, 3] and caplog.text.count("failed after") == 1  # one warning per outage
    inner.down = False
    t.log_metrics({"a": 4.0}, 4)  # back: 2 and 3 first, in order
    assert inner.logged == [1, 2, 3, 4] and t.missing == []
    t.close("FINISHED")
    assert inner.closed == "FINISHED"
    report = t.missing_report()
    assert report.startswith("tracker: every metric point was logged; 3 calls failed in all, the first with "
                             "ConnectionError: connection refused")


def test_points_still_missing_at_the_end_are_reported():
    inner = Flaky()
    t = RetryingTracker(inner, retries=1, backoff_s=0.0, sleep=lambda s: None)
    for step in (1, 2):
        t.log_metrics({"a": 1.0}, step)
    inner.down = True
    for step in (3, 4, 5, 7):
        t.log_metrics({"a": 1.0}, step)
    t.close("FINISHED")
    assert inner.closed is None
    assert t.missing_report().startswith("tracker: 4 metric points were not logged (steps 3-5, 7); 6 calls failed")
    assert steps_text([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"


@pytest.mark.integration
def test_an_mlflow_server_killed_mid_run_costs_points_not_the_run(tmp_path):
    from mlflow.tracking import MlflowClient

    from tests.support.servers import _start_mlflow

    (tmp_path / "server").mkdir()
    server = _start_mlflow(tmp_path / "server")
    uri = server["uri"]
    try:
        # The server answers /health before its store's first query: under a loaded tier that first query took over
        # the run's 10 s request deadline and the run stopped at start (a store that cannot be opened is an error).
        # The test is about a server lost mid-run: it makes its server's first query itself, and gives the run's
        # requests the deadline of a loaded machine (a refused connection after the kill fails at once either way).
        client = MlflowClient(uri)
        client.search_experiments()
        args = ["logger.progress_bar=false", *FAST, "num_rollout=8", "save_interval=1", "eval=none", "warmstart=none",
                f"logger.tracking_uri={uri}", "logger.tracker_retry_backoff_s=0.2", "logger.tracker_timeout_s=60",
                f"hydra.run.dir={tmp_path}/run",
                "+reward.custom_rm={_target_:tests.support.plugins.slow_reward,seconds:0.03}"]
        proc = start_cli(args, tmp_path)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # kill the server once the run has logged step 2
            exp = client.get_experiment_by_name("slime_hydra")
            runs = client.search_runs([exp.experiment_id]) if exp else []
            if runs and 2 in [m.step for m in client.get_metric_history(runs[0].info.run_id, "rollout/reward_mean")]:
                break
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        os.killpg(server["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        try:
            os.killpg(server["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, err[-3000:]
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.glob("rollout_*")) == [f"rollout_{i:06d}" for i in range(8)]  # every checkpoint
    report = (tmp_path / "run" / "tracker_missing.txt").read_text()
    assert report.startswith("tracker: ") and "metric points were not logged (steps " in report and "-8)" in report
    assert f"warning: {report.strip()}" in err
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["rollout/reward_mean"]["count"] == 8
