"""MLflowTracker against a real sqlite store: where a run's artifacts land."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from slime_hydra.tracking.mlflow_tracker import MLflowTracker
from tests.support.runs import mlflow_db


def test_artifacts_land_beside_the_sqlite_store_not_in_the_working_directory(tmp_path, monkeypatch):
    uri = mlflow_db(tmp_path / "store" / "mlflow.db")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a run started from another directory (MLflow's default root is ./mlruns)
    summary = tmp_path / "summary.json"
    summary.write_text('{"eval/addition/accuracy": 0.9}')

    t = MLflowTracker(uri, "grpo/exp", "run")
    t.log_artifact(str(summary))
    t.close()

    assert list(elsewhere.iterdir()) == []
    root = tmp_path / "store" / "mlruns" / "grpo_exp"  # one folder per experiment, named after it
    (stored,) = root.rglob("summary.json")
    assert stored.read_text() == summary.read_text()
    run = MlflowClient(uri).get_run(t.run_id)
    assert run.info.artifact_uri.startswith(root.as_uri())


def test_a_relative_sqlite_store_keeps_its_artifacts_in_the_working_directory(tmp_path, monkeypatch):
    mlflow_db(tmp_path / "mlruns.db")
    monkeypatch.chdir(tmp_path)
    t = MLflowTracker("sqlite:///mlruns.db", "exp", "run")  # the logger group's default URI
    t.log_artifact(str(tmp_path / "mlruns.db"), "copy")
    t.close()
    assert len(list((tmp_path / "mlruns" / "exp").rglob("mlruns.db"))) == 1


def test_the_sweep_callback_imports_without_mlflow():
    """conf/config.yaml registers the sweep callback for every run, so importing it must not need mlflow: a
    `logger=tensorboard` run on a machine without mlflow (the GPU image) stopped at Hydra start when it did."""
    import subprocess
    import sys

    code = ("import sys\nclass Block:\n    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'mlflow' or name.startswith('mlflow.'):\n            raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\nimport slime_hydra.tracking.sweep\n"
            "import slime_hydra.tracking.experiments\nprint('ok', 'mlflow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["ok", "False"], out.stderr[-2000:]
