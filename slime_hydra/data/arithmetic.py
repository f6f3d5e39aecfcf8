"""Deterministic synthetic arithmetic tasks whose answers a rule can verify.

`python -m slime_hydra.data.arithmetic` regenerates the files shipped in slime_hydra/assets;
a test checks that the shipped files equal what this produces.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

OPS = {"add": ("+", lambda a, b: a + b), "sub": ("-", lambda a, b: a - b)}


def make_pairs(op: str, low: int, high: int, num_test: int, seed: int) -> tuple[list[dict], list[dict]]:
    """All operand pairs in [low, high]², shuffled by `seed`, split into (train, test)."""
    symbol, fn = OPS[op]
    pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    random.Random(seed).shuffle(pairs)
    rows = [{"prompt": f"{a}{symbol}{b}=", "label": str(fn(a, b))} for a, b in pairs]
    return rows[num_test:], rows[:num_test]


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def generate(out_dir: Path) -> None:
    for name, op in (("addition", "add"), ("subtraction", "sub")):
        train, test = make_pairs(op, 10, 99, num_test=200, seed=0)
        write_jsonl(train, out_dir / name / "train.jsonl")
        write_jsonl(test, out_dir / name / "test.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "assets")
    generate(parser.parse_args().out)


if __name__ == "__main__":
    main()
