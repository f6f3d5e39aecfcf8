"""Rule-based verifiers: (response, label) -> reward in {0, 1}.

They score the answer, never the format alone: a well-formed wrong answer gets 0.
"""

from __future__ import annotations

import re
from typing import Optional

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _to_number(text: str) -> Optional[float]:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def last_number(text: str) -> Optional[str]:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def math_reward(response: str, label: Optional[str]) -> float:
    """1 if the last number in the response equals the label numerically (`1,000` == `1000.0`)."""
    if label is None:
        return 0.0
    pred = last_number(response)
    if pred is None:
        return 0.0
    a, b = _to_number(pred), _to_number(str(label).strip())
    if a is None or b is None:
        return float(pred.strip() == str(label).strip())
    return float(abs(a - b) < 1e-9)


def exact_match_reward(response: str, label: Optional[str]) -> float:
    return float(label is not None and response.strip() == str(label).strip())


VERIFIERS = {"math": math_reward, "exact_match": exact_match_reward}
