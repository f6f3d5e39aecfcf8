"""Reward functions: rule-based verifiers and the custom `_target_` hook."""
