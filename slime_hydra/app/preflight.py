"""Compose and check before anything heavy starts, reporting every problem at once.

Each override is checked against the schema (config/compose.py), then the typed config is derived and goes
through every check (app/checks.py). A multirun composes and checks every job, so a typo in the tenth sweep
value fails before Ray or a model starts. `compose_run` is the same path for one run, for tests and tools.
"""

from __future__ import annotations

from typing import Optional

from omegaconf import DictConfig

from slime_hydra.app.checks import check
from slime_hydra.config.compose import Composer, check_overrides, expand_sweeps, hydra_message, to_run_config
from slime_hydra.config.redact import redact_override
from slime_hydra.config.schema import RunConfig
from slime_hydra.errors import ConfigError


def check_composed(cfg: DictConfig) -> tuple[Optional[RunConfig], list[str], list[str]]:
    """A composed config -> (the typed and derived RunConfig, or None; every problem; notes)."""
    try:
        typed = to_run_config(cfg)
    except Exception as e:  # noqa: BLE001 - missing values and interpolation errors
        return None, [hydra_message(e)], []
    return check(typed)


def preflight(overrides: list[str], multirun: bool = False, config_name: str = "config") -> list[RunConfig]:
    """Compose + validate every job; raise ConfigError listing every problem."""
    jobs = expand_sweeps(overrides) if multirun else [overrides]
    problems: list[str] = []
    configs: list[RunConfig] = []
    with Composer(config_name) as composer:
        for job in jobs:
            cfg, probs = check_overrides(composer, job)
            if cfg is not None:
                typed, more, _ = check_composed(cfg)
                probs = probs + more
                if typed is not None and not probs:
                    configs.append(typed)
            prefix = f"[job {' '.join(map(redact_override, job))}] " if multirun and len(jobs) > 1 else ""
            problems.extend(prefix + p for p in probs if prefix + p not in problems)
    if problems:
        raise ConfigError(problems)
    return configs


def compose_run(overrides: list[str], config_name: str = "config") -> RunConfig:
    """Compose, validate and derive one run's typed config (the path tests and tools use)."""
    with Composer(config_name) as composer:
        cfg, problems = check_overrides(composer, overrides)
        if cfg is None:
            raise ConfigError(problems)
        typed, more, _ = check_composed(cfg)
        problems += more
    if problems:
        raise ConfigError(problems)
    return typed
