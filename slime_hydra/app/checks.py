"""Every check of a typed RunConfig: the config's own (config/validate.py), then each component's (the advantage
estimator's among them: algorithms/checks.py reads its row of the estimator table).

A component's checks live beside it and receive only the groups they read; this is the one place that
knows which components a run uses. Nothing here imports a backend (megatron, sglang, ray, torch).
"""

from __future__ import annotations

from slime_hydra.agent.hook import check_generate
from slime_hydra.algorithms import checks as estimator_checks
from slime_hydra.config import validate
from slime_hydra.config.schema import RunConfig
from slime_hydra.models import checks as model_checks
from slime_hydra.rewards import checks as reward_checks
from slime_hydra.rollout.sglang import checks as sglang_checks
from slime_hydra.training.megatron import checks as megatron_checks


def check(cfg: RunConfig) -> tuple[RunConfig, list[str], list[str]]:
    """(config with derived values filled in, every problem, notes about derivations)."""
    cfg, problems, notes = validate.check(cfg)
    more, more_notes = estimator_checks.check(cfg.algorithm, cfg.rollout.n_samples_per_prompt, cfg.num_rollout)
    problems, notes = problems + more, notes + more_notes
    problems += model_checks.check(cfg.model)
    if cfg.train.backend == "megatron":
        problems += megatron_checks.check(cfg.model, cfg.parallelism, cfg.train, cfg.cluster.device, cfg.load)
        problems += megatron_checks.check_layout(cfg.parallelism, cfg.cluster)
    else:
        problems += megatron_checks.check_unused(cfg.train)
    check_generate("rollout.custom_generate", cfg.rollout.custom_generate, problems)
    rm_types = {"reward.rm_type": cfg.reward.rm_type}
    rm_types |= {f"eval.eval_prompt_data.{n}.rm_type": d.rm_type for n, d in validate.eval_datasets(cfg).items()}
    problems += reward_checks.check(cfg.reward, rm_types)
    if cfg.rollout.backend == "sglang":  # reads sglang's sources with ast, imports nothing
        problems += sglang_checks.check(cfg.rollout, cfg.cluster)
    return cfg, problems, notes
