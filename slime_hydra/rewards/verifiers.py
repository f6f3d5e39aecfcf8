"""Rule-based verifiers with slime's semantics: (response, label) -> float or dict reward.

Math equivalence uses HuggingFace's `math-verify` (LaTeX/sympy parsing: `0.5` == `\\frac{1}{2}`,
`1,000` == `1000`) rather than hand-written parsing; string normalisation is the fallback when
neither side parses. They score the answer, never the format alone: a well-formed wrong answer is 0.
"""

from __future__ import annotations

import re
import string
import threading
from collections import Counter
from typing import Callable, Optional, Union

Reward = Union[float, dict]
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_boxed(text: str) -> Optional[str]:
    """Content of the last \\boxed{...} (or \\fbox{...}), nested braces included; None if absent or unclosed."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def last_number(text: str) -> Optional[str]:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def final_answer(response: str) -> Optional[str]:
    """The last \\boxed{} answer if there is one, else the last number."""
    boxed = last_boxed(response)
    return boxed if boxed is not None else last_number(response)


def _normalize(s: str) -> str:
    s = s.strip().strip("$").replace(",", "").replace(" ", "").rstrip(".")
    return s[:-2] if s.endswith(".0") else s


MATH_VERIFY_TIMEOUT_S = 30


def equivalent(pred: str, label: str) -> bool:
    """Mathematical equivalence via math-verify, falling back to normalised string equality."""
    a, b = _normalize(pred), _normalize(label)
    if a == b:
        return True
    if _PLAIN_NUMBER.fullmatch(a) and _PLAIN_NUMBER.fullmatch(b):  # the common case, without a sympy parse
        return abs(float(a) - float(b)) < 1e-9
    # math-verify times out with signal.alarm, which only the main thread may set: elsewhere (the async
    # collector's worker) no timeout; in the main thread a generous one (a loaded CPU slows the first parse)
    t = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        from math_verify import parse, verify

        gold, guess = parse(f"${label}$", parsing_timeout=t), parse(f"${pred}$", parsing_timeout=t)
        return bool(gold and guess and verify(gold, guess, timeout_seconds=t))
    except Exception:  # noqa: BLE001 - an unparsable answer is simply not equivalent
        return False


def math_reward(response: str, label: Optional[str]) -> float:
    """slime's `math`: the final answer (last \\boxed{}, else last number) is equivalent to the label."""
    if label is None:
        return 0.0
    pred = final_answer(response)
    return float(pred is not None and equivalent(pred, str(label)))


def deepscaler_reward(response: str, label: Optional[str]) -> float:
    """slime's `deepscaler`: only the text after `</think>` (or `###Response`) counts; 0 without it."""
    for marker in ("</think>", "###Response"):
        if marker in response:
            return math_reward(response.split(marker)[-1], label)
    return 0.0


_DAPO_ANSWER = re.compile(r"(?i)answer\s*:\s*([^\n]+)")


def dapo_reward(response: str, label: Optional[str]) -> dict:
    """slime's `dapo`: the last `Answer: X` in the last 300 characters; score ±1 with acc and pred."""
    found = _DAPO_ANSWER.findall(response[-300:])
    pred = found[-1].strip() if found else ""
    acc = bool(pred) and label is not None and equivalent(pred, str(label))
    return {"score": 1.0 if acc else -1.0, "acc": acc, "pred": pred}


def _squad_tokens(s: str) -> list[str]:
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return re.sub(r"\b(a|an|the)\b", " ", s).split()


def f1_reward(response: str, label: Optional[str]) -> float:
    """SQuAD-style token F1 after lower-casing and removing punctuation and articles."""
    pred, gold = _squad_tokens(response), _squad_tokens(label or "")
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    p, r = common / len(pred), common / len(gold)
    return 2 * p * r / (p + r)


def exact_match_reward(response: str, label: Optional[str]) -> float:
    return float(label is not None and response.strip() == str(label).strip())


VERIFIERS: dict[str, Callable[[str, Optional[str]], Reward]] = {
    "math": math_reward,
    "deepscaler": deepscaler_reward,
    "dapo": dapo_reward,
    "f1": f1_reward,
    "exact_match": exact_match_reward,
}
BOXED_PREFIX = "boxed_"


def verifier(rm_type: str) -> Callable[[str, Optional[str]], Reward]:
    """`boxed_<name>` first extracts the last \\boxed{} (0 / -1 when there is none), then applies <name>."""
    if rm_type.startswith(BOXED_PREFIX):
        base = VERIFIERS[rm_type[len(BOXED_PREFIX):]]

        def boxed(response: str, label: Optional[str]) -> Reward:
            inner = last_boxed(response)
            if base is math_reward:  # the box content is the answer itself, not text to search
                return float(inner is not None and label is not None and equivalent(inner, str(label)))
            return base(inner if inner is not None else "", label)

        return boxed
    return VERIFIERS[rm_type]


def known_rm_types() -> list[str]:
    return sorted(VERIFIERS) + sorted(BOXED_PREFIX + k for k in VERIFIERS) + ["remote_rm"]
