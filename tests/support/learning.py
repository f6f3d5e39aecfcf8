"""What a learning test measured, printed on one line so that benchmarks/repeat_learning_tests.py can collect the
spread its bounds are set from: `LEARNING {"test": ..., figure: value, ...}` (pytest shows it with -s)."""

from __future__ import annotations

import json


def report(test: str, **figures: float) -> None:
    print("LEARNING " + json.dumps({"test": test, **figures}), flush=True)
