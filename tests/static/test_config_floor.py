"""The config floor knows only the config, and checks only read.

- No module of slime_hydra/config/ names a backend (train, rollout, cluster), a model implementation or an advantage
  estimator, as a word, outside the schema (schema.py: the fields that carry them, and their comments) and its table
  of allowed values (choices.py): a rule that depends on one lives beside it, and app/checks.py calls it.
- No check writes into the config: derivation is one step that returns a new config (app/derive.py), so no check
  module and not the derivation itself assigns to an attribute (`cfg.train.micro_batch_size = ...`).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from slime_hydra.algorithms.estimators import ESTIMATORS
from slime_hydra.config.choices import CHOICES
from tests.support.runs import ROOT

PACKAGE = ROOT / "slime_hydra"
SCHEMA = {"schema.py", "choices.py"}
ORDINARY_WORDS = {"local", "auto"}  # cluster.backend=local, model.model_impl=auto: words of plain prose too


def backend_names() -> set[str]:
    keys = ("train.backend", "rollout.backend", "cluster.backend", "model.model_impl")
    names = {n for k in keys for n in CHOICES[k]} | set(ESTIMATORS)
    names |= {p.stem for p in (ROOT / "conf" / "algorithm").glob("*.yaml")}  # dapo, dr_grpo: options of an estimator
    return names - ORDINARY_WORDS


def test_config_names_no_backend_outside_the_schema():
    word = re.compile(r"\b(" + "|".join(sorted(backend_names())) + r")\b", re.I)
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in sorted((PACKAGE / "config").glob("*.py"))
             if p.name not in SCHEMA for i, line in enumerate(p.read_text().splitlines(), 1) if word.search(line)]
    assert found == [], "a backend named on the config floor; move the rule beside the backend:\n" + "\n".join(found)


def check_modules() -> list[Path]:
    return sorted({*(PACKAGE / "config").glob("checks*.py"), *PACKAGE.rglob("checks.py"),
                   PACKAGE / "app" / "derive.py"})


def test_checks_and_derivation_write_nothing_in_place():
    writes = []
    for path in check_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AugAssign) else []
            for t in targets:
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(el, ast.Attribute):
                        writes.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert len(check_modules()) >= 10  # config's, each component's, the composition floor's, derive
    assert writes == [], "a check writes into the config; derive the value in app/derive.py instead:\n" + "\n".join(writes)
