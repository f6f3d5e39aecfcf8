"""A store that runs started together cannot break (tracking/store.py): a half-made migration left by an older crash
is repaired, a store that does not open is named with the commands that repair it, and six runs started at once in a
fresh directory on the default sqlite store all finish with complete histories."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from slime_hydra.tracking.store import StoreError, open_client
from tests.support.runs import FAST, start_cli

BEFORE_BATCH = "c8d9e0f1a2b3"  # the revision before one that rebuilds `experiments` through _alembic_tmp_experiments


def half_made_store(path) -> str:
    """A store migrated up to BEFORE_BATCH, then interrupted in the next migration right after its copy of
    `experiments` (the state a crash there leaves: the copy beside the original)."""
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    uri = f"sqlite:///{path}"
    engine = sqlalchemy.create_engine(uri)
    InitialBase.metadata.create_all(engine)
    config = _get_alembic_config(uri)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, BEFORE_BATCH)
    engine.dispose()
    with sqlite3.connect(path) as con:
        con.execute("INSERT INTO experiments (name, lifecycle_stage) VALUES ('kept', 'active')")
        con.execute("CREATE TABLE _alembic_tmp_experiments AS SELECT * FROM experiments")
    return uri


def tables(path) -> set[str]:
    with sqlite3.connect(path) as con:
        return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_a_half_made_migration_is_repaired_and_the_store_upgraded(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = half_made_store(tmp_path / "mlruns.db")
    shutil.copy(tmp_path / "mlruns.db", tmp_path / "plain.db")
    with pytest.raises(Exception, match="_alembic_tmp_experiments already exists"):  # what MLflow alone does with it
        MlflowClient(f"sqlite:///{tmp_path / 'plain.db'}").search_experiments()

    client = open_client(uri)
    assert "_alembic_tmp_experiments" not in tables(tmp_path / "mlruns.db")
    assert client.get_experiment_by_name("kept") is not None  # the original table, with its rows, upgraded
    run = client.create_run(client.create_experiment("after"))
    client.log_metric(run.info.run_id, "m", 1.0, step=1)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "m")] == [1]


def test_a_store_that_does_not_open_is_named_with_its_fix(tmp_path):
    db = tmp_path / "mlruns.db"
    db.write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError) as info:
        open_client(f"sqlite:///{db}")
    text = str(info.value)
    assert text.startswith(f"logger.tracking_uri=sqlite:///{db}: the MLflow store could not be opened")
    assert f"mlflow db upgrade sqlite:///{db}" in text and "logger.tracker=none" in text


@pytest.mark.integration
def test_six_runs_started_at_once_share_a_fresh_default_store(workdir):
    """Six CLI runs started together in a fresh directory, each with its own output directory, on the default
    `sqlite:///mlruns.db`: all finish, and all six are in the store with every point of their history."""
    from mlflow.tracking import MlflowClient

    common = [*FAST, "num_rollout=2", "eval=none", "warmstart=none"]
    procs = [start_cli([*common, f"seed={i}", f"hydra.run.dir={workdir}/run{i}"], workdir) for i in range(6)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
        assert "warning: tracker" not in err  # no call had to be given up
    client = MlflowClient(f"sqlite:///{workdir / 'mlruns.db'}")
    runs = client.search_runs([client.get_experiment_by_name("slime_hydra").experiment_id])
    assert len(runs) == 6 and {r.info.status for r in runs} == {"FINISHED"}
    for r in runs:
        assert [m.step for m in client.get_metric_history(r.info.run_id, "rollout/reward_mean")] == [1, 2]
