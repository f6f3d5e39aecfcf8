"""Registers the schemas in Hydra's ConfigStore and the project's OmegaConf resolvers."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from slime_hydra.config.schema import GROUP_SCHEMAS, RunConfig

PACKAGE_DIR = Path(__file__).resolve().parents[1]
CONF_DIR = PACKAGE_DIR.parent / "conf"
ASSETS_DIR = PACKAGE_DIR / "assets"

_registered = False


def asset_path(relative: str) -> str:
    """`${asset:addition/train.jsonl}` -> absolute path of a file shipped in slime_hydra/assets."""
    return str(ASSETS_DIR / relative)


def register() -> None:
    global _registered
    if _registered:
        return
    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    for group, schema in GROUP_SCHEMAS.items():
        cs.store(group="schema", name=group, node=schema)
    if not OmegaConf.has_resolver("asset"):
        OmegaConf.register_new_resolver("asset", asset_path)
    _registered = True
