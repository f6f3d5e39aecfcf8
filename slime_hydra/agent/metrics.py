"""Rollout metrics of multi-turn samples (from the metadata the multi-turn loop writes), and per agent where a
generate hook names the agent of each sample it returns (metadata["agent"])."""

from __future__ import annotations

from slime_hydra.types import Sample


def agent_metrics(samples: list[Sample], prefix: str = "rollout") -> dict[str, float]:
    """turns_mean, tool_calls_mean, tool_error_rate (errors per executed call) and masked_token_frac (the share
    of response tokens that do not train: observations); {} when no sample went through a multi-turn hook."""
    out = per_agent(samples, prefix)
    agent = [s for s in samples if "turns" in s.metadata]
    if not agent:
        return out
    calls = sum(s.metadata["tool_calls"] for s in agent)
    response = sum(s.response_length for s in samples)
    masked = sum(s.response_length - sum(s.loss_mask if s.loss_mask is not None else [1] * s.response_length)
                 for s in samples)
    return out | {
        f"{prefix}/turns_mean": sum(s.metadata["turns"] for s in agent) / len(agent),
        f"{prefix}/tool_calls_mean": calls / len(agent),
        f"{prefix}/tool_error_rate": sum(s.metadata["tool_errors"] for s in agent) / calls if calls else 0.0,
        f"{prefix}/masked_token_frac": masked / response if response else 0.0,
    }


def per_agent(samples: list[Sample], prefix: str) -> dict[str, float]:
    """<prefix>/<agent>_reward_mean for each metadata["agent"] (solver, checker, ...); {} when no sample names one."""
    by: dict[str, list[float]] = {}
    for s in samples:
        if isinstance(s.metadata.get("agent"), str) and s.reward is not None:
            by.setdefault(s.metadata["agent"], []).append(float(s.reward))
    return {f"{prefix}/{a}_reward_mean": sum(r) / len(r) for a, r in sorted(by.items())}
