"""`slime-hydra check-hf DIR [model=<option> overrides...]`: does a model option match a Hugging Face config.json?

The check itself (models/hf_check.py) is a function of (ModelConfig, config.json); this composes the
model option from the overrides and prints each mismatch. Exit 0 when they match, 2 otherwise.
"""

from __future__ import annotations

import sys
from typing import Optional

from slime_hydra.app.preflight import compose_run
from slime_hydra.errors import UserError
from slime_hydra.models.hf_check import check_hf_config

USAGE = "usage: slime-hydra check-hf CONFIG_JSON_OR_DIR [model=<option> overrides...]"


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        model = compose_run(argv[1:]).model
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problems = check_hf_config(model, argv[0])
    for p in problems:
        print(f"mismatch: {p}")
    if not problems:
        print(f"model={model.name} matches {argv[0]}")
    return 2 if problems else 0
