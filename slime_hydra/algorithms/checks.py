"""Checks of the algorithm keys that depend on the estimator, read from its row in `estimators.ESTIMATORS`.

config/ sits below this floor and cannot see the table, so the estimator's name and everything that depends on
what it is (a group baseline, a critic, the shaped KL, whitening) is checked here; app/checks.py calls `check`
after the config's own checks. Each problem names the key and the fix. Checks that read no estimator fact stay
in config/checks_algorithm.py.
"""

from __future__ import annotations

from typing import Optional

from slime_hydra.algorithms.estimators import ESTIMATORS
from slime_hydra.config.schema import AlgorithmConfig


def check(a: AlgorithmConfig, n_samples_per_prompt: int, num_rollout: Optional[int]) -> tuple[list[str], list[str]]:
    """(problems, notes) of algorithm.advantage_estimator and the keys its row constrains; n_samples_per_prompt is
    rollout.n_samples_per_prompt (the group size), num_rollout the run's (None before it is derived)."""
    problems: list[str] = []
    notes: list[str] = []
    name = a.advantage_estimator
    row = ESTIMATORS.get(name)
    if row is None:
        return [f"algorithm.advantage_estimator={name!r} is not one of {list(ESTIMATORS)}"], notes
    if row.group_baseline and a.rewards_normalization and n_samples_per_prompt < 2:
        problems.append(f"rollout.n_samples_per_prompt={n_samples_per_prompt}: {name}'s group baseline needs at least "
                        "2 samples per prompt (a group of one has no baseline); set rollout.n_samples_per_prompt>=2")
    if a.kl_coef != 0 and not row.shaped_kl:
        problems.append(f"algorithm.kl_coef={a.kl_coef} has no effect with algorithm.advantage_estimator={name} (its "
                        "advantages ignore the shaped KL); use algorithm.use_kl_loss=true with algorithm.kl_loss_coef, "
                        "or algorithm.kl_coef=0")
    if row.requires_whitening and not a.normalize_advantages:
        problems.append(f"algorithm.advantage_estimator={name} needs algorithm.normalize_advantages=true (slime asserts "
                        f"it); set algorithm.normalize_advantages=true or use algorithm={name}")
    if row.single_sided_clip and a.eps_clip < 1.0:
        notes.append(f"algorithm.advantage_estimator={name} with algorithm.eps_clip={a.eps_clip} keeps the lower clip bound "
                     f"{1.0 - a.eps_clip:g} active; canonical {name} is single-sided: algorithm={name} sets eps_clip=1.0")
    if row.critic:
        if a.custom_advantage:
            problems.append(f"algorithm.custom_advantage would replace {name}'s GAE and leave its critic without returns; "
                            "use a critic-free algorithm.advantage_estimator with algorithm.custom_advantage, or drop it")
        if num_rollout is not None and a.num_critic_only_steps >= num_rollout:
            problems.append(f"algorithm.num_critic_only_steps={a.num_critic_only_steps} leaves no rollout for the policy "
                            f"(num_rollout={num_rollout}); set it below num_rollout")
    elif a.num_critic_only_steps:
        with_critic = " or ".join(f"algorithm={n}" for n, r in ESTIMATORS.items() if r.critic)
        problems.append(f"algorithm.num_critic_only_steps={a.num_critic_only_steps} needs a critic: set {with_critic}, "
                        "or algorithm.num_critic_only_steps=0")
    return problems, notes
