"""What a run attaches to instead of starting it: SGLang engines (rollout.rollout_external_engine_addrs) and the
sglang-router (rollout.sglang_router_ip / rollout.sglang_router_port), with their keys from the environment (preflight
checked them set), as SGLangRollout's keyword arguments. Both builders (local, Ray) use it."""

from __future__ import annotations

import os
from typing import Any

from slime_hydra.config.schema import RolloutConfig
from slime_hydra.rollout.sglang.checks import parse_engine_addr
from slime_hydra.rollout.sglang.endpoint import KEY_ENV, ROUTER_KEY_ENV, Endpoint
from slime_hydra.rollout.sglang.engines import ExternalLauncher, http_url
from slime_hydra.rollout.sglang.external_router import ExternalRouter


def sglang_attachments(rollout: RolloutConfig) -> dict[str, Any]:
    """{} when the run starts its engines and router; else launcher + key (engines) and/or external_router."""
    attach: dict[str, Any] = {}
    if rollout.rollout_external_engine_addrs:  # none started here; their key is the environment's
        addrs = [parse_engine_addr(str(a)) for a in rollout.rollout_external_engine_addrs]
        attach |= {"launcher": ExternalLauncher([a for a in addrs if a is not None]), "key": os.environ[KEY_ENV]}
    if rollout.sglang_router_ip is not None:
        router = Endpoint(http_url(rollout.sglang_router_ip, rollout.sglang_router_port), os.environ[ROUTER_KEY_ENV])
        attach["external_router"] = ExternalRouter(router, rollout.sglang_server_start_timeout_s)
    return attach
