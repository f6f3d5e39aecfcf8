"""The advantage estimators by name: the one table that validation, the composition floor and the tests read.

`algorithm.advantage_estimator` names a row of ESTIMATORS. A row holds the pure advantage function and the
`algorithm.*` keys it reads, the policy surrogate the estimator trains with and the keys that surrogate reads,
and the facts that checks and composition branch on (group baseline, critic, shaped KL, whitening). A function's
keyword arguments share the names of the keys it reads, so binding is `partial(fn, **{key: a.<key>})` (`bind`).
A new estimator is a pure function, a row here and an option file `conf/algorithm/<name>.yaml`; no other module
spells its name. Its checks read the row (`algorithms/checks.py`); app/algorithm.py builds the specs from it.

Left out: a registration decorator or entry points (one dict reads top to bottom; a plug-in estimator is
`algorithm.custom_advantage`), and names in config/ (config sits below this floor: the name is checked here).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional

from torch import Tensor

from slime_hydra.algorithms import advantages as A
from slime_hydra.algorithms import losses as L
from slime_hydra.algorithms import surrogates as S
from slime_hydra.config.schema import AlgorithmConfig

CLIP_KEYS = ("eps_clip", "eps_clip_high", "eps_clip_c")  # PPO-clip's band and dual clip
GROUP_KEYS = ("rewards_normalization", "grpo_std_normalization")


@dataclass(frozen=True)
class AdvantageEstimator:
    """One row: what `algorithm.advantage_estimator=<name>` computes, trains with and requires."""

    # (rewards [N], mask [N, T], kl [N, T] | None, group_size, **keys) -> advantages [N, T]; with critic:
    # (rewards [N], mask [N, T], kl [N, T] | None, values [N, T], **keys) -> (advantages [N, T], returns [N, T])
    advantage: Callable[..., Any]
    advantage_keys: tuple[str, ...]  # the algorithm keys `advantage` takes as keyword arguments
    surrogate: Callable[..., tuple[Tensor, Tensor, Tensor]] = L.ppo_clip_loss  # the policy loss per token
    surrogate_keys: tuple[str, ...] = CLIP_KEYS
    group_baseline: bool = False  # centres rewards per prompt group (with rewards_normalization): needs >= 2 samples
    critic: bool = False  # GAE over a learned value model: the run trains a critic, and `advantage` takes its values
    shaped_kl: bool = False  # its advantages read the shaped token KL (algorithm.kl_coef); otherwise kl_coef is refused
    requires_whitening: bool = False  # slime asserts algorithm.normalize_advantages=true
    single_sided_clip: bool = False  # canonical form has no lower clip bound (eps_clip >= 1): a note otherwise


ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": AdvantageEstimator(A.group_estimator, GROUP_KEYS, group_baseline=True),
    "gspo": AdvantageEstimator(A.group_estimator, GROUP_KEYS, surrogate=S.gspo_loss, group_baseline=True),
    "cispo": AdvantageEstimator(A.group_estimator, GROUP_KEYS, surrogate=S.cispo_loss,
                                surrogate_keys=("eps_clip", "eps_clip_high"), group_baseline=True, single_sided_clip=True),
    "rloo": AdvantageEstimator(A.rloo_estimator, ("rewards_normalization",), group_baseline=True),
    "reinforce_plus_plus": AdvantageEstimator(A.reinforce_plus_plus_estimator, ("kl_coef", "gamma"), shaped_kl=True,
                                              requires_whitening=True),
    "reinforce_plus_plus_baseline": AdvantageEstimator(A.reinforce_plus_plus_baseline_estimator,
                                                       ("kl_coef", "rewards_normalization"), group_baseline=True,
                                                       shaped_kl=True, requires_whitening=True),
    "ppo": AdvantageEstimator(A.ppo_advantages, ("kl_coef", "gamma", "lambd", "normalize_advantages"), critic=True,
                              shaped_kl=True),
}


def bind(fn: Callable[..., Any], keys: tuple[str, ...], a: AlgorithmConfig) -> partial:
    """fn with each of `keys` bound to the algorithm group's value of the same name."""
    return partial(fn, **{key: getattr(a, key) for key in keys})


def compute_advantages(estimator: str, rewards: Tensor, mask: Tensor, kl: Optional[Tensor], group_size: int, *,
                       custom: Optional[A.CustomAdvantage] = None, **keys: Any) -> Tensor:
    """[N] scalar rewards -> [N, T] per-token advantages of the named estimator (for tests and benchmarks; a run
    gets the same function through app/algorithm.py's AdvantageSpec).

    `keys` are algorithm keys (rewards_normalization, grpo_std_normalization, kl_coef, gamma, normalize_advantages),
    the schema's defaults otherwise. custom (algorithm.custom_advantage) replaces the estimator;
    normalize_advantages then whitens over every masked token of the batch. A critic estimator needs the critic's
    values: call its function (ppo: `advantages.ppo_advantages`).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage_estimator {estimator!r}; one of {list(ESTIMATORS)}")
    row = ESTIMATORS[estimator]
    if row.critic:
        raise ValueError(f"advantage_estimator={estimator} needs the critic's values: call {row.advantage.__name__}")
    a = AlgorithmConfig(advantage_estimator=estimator, **keys)
    fn = partial(A.plugin_estimator, fn=custom) if custom is not None else bind(row.advantage, row.advantage_keys, a)
    adv = fn(rewards, mask, kl, group_size)  # [N, T]
    return A.masked_whiten(adv, mask) if a.normalize_advantages else adv
