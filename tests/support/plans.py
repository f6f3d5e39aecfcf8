"""Reading `slime-hydra plan`'s text back: its rank table and its engines (tests/app/test_plan.py, and the
multi-node tests that compare a plan with the placement Ray made)."""

from __future__ import annotations

import re


def ranks(text: str) -> dict[int, dict[str, int]]:
    """The rank table: rank -> {node, bundle, GPU|CPU, TP, PP, DP}."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["rank", "node", "bundle"])
    head = lines[start].split()
    out = {}
    for line in lines[start + 1:]:
        cells = line.split()
        if not cells or not cells[0].isdigit():
            break
        out[int(cells[0])] = dict(zip(head[1:], map(int, cells[1:]), strict=True))
    return out


def engines(text: str) -> dict[int, tuple[list[int], int]]:
    """engine -> (its bundles, its node)."""
    found = re.findall(r"^  engine (\d+): bundles \[([\d, ]+)\] \(node (\d+),", text, re.M)
    return {int(e): ([int(b) for b in bundles.split(",")], int(node)) for e, bundles, node in found}
