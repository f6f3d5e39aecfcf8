"""Checks of the reward group: every rm_type in use is a known verifier, and the remote/custom RM keys make sense.

Called by the composition floor (app/checks.py) with the reward group and the rm_type of each place that
scores (the run's and every eval set's).
"""

from __future__ import annotations

import math

from slime_hydra.config.schema import RewardConfig
from slime_hydra.rewards.verifiers import known_rm_types


def check(rm: RewardConfig, rm_types: dict[str, str]) -> list[str]:
    """`rm_types`: config key -> rm_type, e.g. {"reward.rm_type": "math", "eval.eval_prompt_data.aime.rm_type": "dapo"}."""
    problems = []
    for key, value in rm_types.items():
        if value not in known_rm_types():
            problems.append(f"{key}={value!r} is not one of {known_rm_types()}")
        if value == "remote_rm" and not rm.rm_url:
            problems.append(f"{key}=remote_rm needs reward.rm_url=http://host:port/path")
    if rm.rm_type == "dapo" and rm.reward_key is None and not rm.custom_rm:
        problems.append("reward.rm_type=dapo returns a dict reward; set reward.reward_key=score")
    for key in ("rm_concurrency", "rm_max_retries"):
        if getattr(rm, key) < (1 if key == "rm_concurrency" else 0):
            problems.append(f"reward.{key}={getattr(rm, key)} must be >= {1 if key == 'rm_concurrency' else 0}")
    if rm.rm_timeout_s <= 0:
        problems.append(f"reward.rm_timeout_s={rm.rm_timeout_s} must be > 0")
    if not math.isfinite(rm.rm_failure_score):
        problems.append(f"reward.rm_failure_score={rm.rm_failure_score} must be a finite number (it is the reward a failed "
                        "or invalid score trains on); set reward.rm_failure_score=0")
    if rm.custom_rm_timeout_s <= 0:
        problems.append(f"reward.custom_rm_timeout_s={rm.custom_rm_timeout_s} must be > 0 (seconds)")
    return problems
