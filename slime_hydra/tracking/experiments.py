"""Find-or-create of an MLflow experiment, safe when several runs start at once.

Imports mlflow only when called: the sweep callback (registered for every run by conf/config.yaml) imports this
module, and a run with `logger=tensorboard` or `logger=none` must start where mlflow is not installed.
"""

from __future__ import annotations

from typing import Any


def experiment_id(client: Any, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment `name` in `client`'s store (an `MlflowClient`), created if missing. Two runs starting
    at once against one server both see it missing; the loser's create fails with RESOURCE_ALREADY_EXISTS (or the
    store's unique constraint), and it then reads the winner's id."""
    from mlflow.exceptions import MlflowException

    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id
