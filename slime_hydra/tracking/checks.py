"""The trackers' checks before a run starts: a W&B run sent online needs its key, and the key only in the environment."""

from __future__ import annotations

from typing import Mapping

from slime_hydra.config.schema import LoggerConfig

KEY_ENV = "WANDB_API_KEY"


def check(cfg: LoggerConfig, environ: Mapping[str, str]) -> list[str]:
    """Problems of the logger group (each names the key and the fix). `environ`: the environment the run starts in."""
    if cfg.tracker != "wandb" or cfg.wandb_mode != "online" or environ.get(KEY_ENV):
        return []
    return [f"logger.wandb_mode=online sends the run to W&B and needs an API key, which is read from ${KEY_ENV} only "
            f"(never from the config, which is logged and saved): export {KEY_ENV}=<your key>, or leave "
            "logger.wandb_mode=offline (the default: the run stays under <output_dir>/<logger.wandb_dir>; "
            "`wandb sync` uploads it later)"]
