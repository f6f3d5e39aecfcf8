"""algorithms/estimators.py: the estimator table is whole and is the only place an estimator's name is spelled.

Every row binds from the algorithm group (its keys are AlgorithmConfig fields and parameters of its functions), every
row has an option file of its name, and no other module of the package compares advantage_estimator with a name or
quotes one (the schema's default aside): validation, the composition floor and the trainers read the row.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from slime_hydra.algorithms.checks import check
from slime_hydra.algorithms.estimators import ESTIMATORS, bind
from slime_hydra.app.preflight import compose_run
from slime_hydra.config.schema import AlgorithmConfig

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {f.name for f in dataclasses.fields(AlgorithmConfig)}


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_every_row_binds_from_the_algorithm_group(name):
    row = ESTIMATORS[name]
    for fn, keys in ((row.advantage, row.advantage_keys), (row.surrogate, row.surrogate_keys)):
        params = inspect.signature(fn).parameters
        assert set(keys) <= FIELDS, (name, fn.__name__, set(keys) - FIELDS)
        assert set(keys) <= set(params), (name, fn.__name__, set(keys) - set(params))
        bound = bind(fn, keys, AlgorithmConfig(advantage_estimator=name))
        assert bound.func is fn and bound.keywords == {k: getattr(AlgorithmConfig(), k) for k in keys}


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_every_row_has_an_option_file_of_its_name(name):
    """algorithm=<name> selects the estimator (the checks' messages name that fix)."""
    assert (ROOT / "conf" / "algorithm" / f"{name}.yaml").is_file(), f"add conf/algorithm/{name}.yaml"
    assert compose_run([f"algorithm={name}"]).algorithm.advantage_estimator == name


def test_an_unknown_name_lists_the_rows():
    (problem,), _ = check(AlgorithmConfig(advantage_estimator="gae"), 8, 10)
    assert problem == f"algorithm.advantage_estimator='gae' is not one of {list(ESTIMATORS)}"


def test_no_module_but_the_table_spells_an_estimator_name():
    names = "|".join(map(re.escape, ESTIMATORS))
    quoted = re.compile(rf"[\"']({names})[\"']")
    compared = re.compile(r"advantage_estimator\s*(==|!=|in\b)|advantage_estimator\.startswith")
    table = ROOT / "slime_hydra" / "algorithms" / "estimators.py"
    schema = ROOT / "slime_hydra" / "config" / "schema.py"  # the default lives once, in the schema
    found = []
    for path in sorted((ROOT / "slime_hydra").rglob("*.py")):
        if path == table:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if compared.search(line) or (path != schema and quoted.search(line)):
                found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "read the estimator's row (algorithms/estimators.py) instead:\n" + "\n".join(found)
