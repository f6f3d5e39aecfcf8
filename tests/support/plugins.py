"""Plug-ins that several tests name by `_target_` (tests.support.plugins.<name>)."""

from __future__ import annotations


def reinforce_surrogate(log_probs, old_log_probs, advantages, mask, scale=1.0):
    """A custom_loss plug-in for the tests: plain REINFORCE, -scale * A * log pi."""
    return -scale * advantages * log_probs


def digit_reward(sample, **kwargs) -> float:
    """Rewards that differ within a group from the first rollout on (the untrained model never adds right)."""
    return float(sum(c.isdigit() for c in sample.response) % 3)
