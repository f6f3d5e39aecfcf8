"""`_target_` plug-ins turned into objects, once, on the composition floor: what runs below it receives callables,
never names. Each node was checked before anything started (it imports, and its signature binds the call the
engine makes: config/plugins.py, agent/hook.py).

A node is {"_target_": "pkg.mod.fn", **kwargs}: the function with its keys bound. A generate hook's key that is itself
a `_target_` node (a tool environment) is bound as a factory: the hook calls `env()` for a fresh one per sample.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from slime_hydra.agent.hook import as_node
from slime_hydra.config.schema import RewardConfig
from slime_hydra.rewards.compute import RewardScorer


def load_target(node: Optional[dict[str, Any]]) -> Optional[Callable[..., Any]]:
    """{"_target_": "pkg.mod.fn", **kwargs} -> fn with kwargs bound; None for an unset node."""
    if not node:
        return None
    from hydra.utils import get_method  # hydra's importer: only when there is a plug-in

    fn = get_method(node["_target_"])
    kwargs = {k: v for k, v in node.items() if k != "_target_"}
    return functools.partial(fn, **kwargs) if kwargs else fn


def load_hook(spec: Any) -> Callable[..., Any]:
    """A generate hook (rollout.custom_generate, or one of rollout.generate_hooks, which a sample's
    metadata.custom_generate names: a dotted path or a `_target_` node) -> the async function with its keys bound, a
    `_target_` key bound as a factory."""
    node = as_node(spec)
    assert node, "an unset hook is not loaded"  # callers check the spec first
    keys = {k: (load_target(v) if isinstance(v, dict) and "_target_" in v else v) for k, v in node.items()}
    return load_target(keys)


def reward_scorer(cfg: RewardConfig, reward_key: Optional[str] = None) -> RewardScorer:
    """The scorer of a reward group, its reward.custom_rm loaded (keys bound; an async def stays one through the
    partial, which the scorer inspects)."""
    return RewardScorer(cfg, reward_key, custom=load_target(cfg.custom_rm))
