"""Scores samples with the configured verifier or a custom `_target_` function."""

from __future__ import annotations

from typing import Any, Callable, Optional

from slime_hydra.rewards.verifiers import VERIFIERS
from slime_hydra.types import Sample


def build_reward_fn(rm_type: str, custom_rm: Optional[dict[str, Any]]) -> Callable[[Sample], float]:
    if custom_rm:
        from hydra.utils import get_method

        fn = get_method(custom_rm["_target_"])
        kwargs = {k: v for k, v in custom_rm.items() if k != "_target_"}
        return lambda s: float(fn(s, **kwargs))
    verifier = VERIFIERS[rm_type]
    return lambda s: verifier(s.response, s.label)


def score(samples: list[Sample], reward_fn: Callable[[Sample], float]) -> None:
    for s in samples:
        s.reward = reward_fn(s)
