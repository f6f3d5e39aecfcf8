"""Preflight checks for rollout.backend=sglang (no sglang import: ServerArgs fields are read with ast).

Called by the composition floor (app/checks.py) with the two groups they read.
"""

from __future__ import annotations

import os
from typing import Optional
from urllib.parse import urlsplit

from slime_hydra.config.schema import ClusterConfig, RolloutConfig
from slime_hydra.rollout.sglang.endpoint import KEY_ENV, ROUTER_KEY_ENV
from slime_hydra.rollout.sglang.server_args import ROUTER_RUNNER_KEYS, RUNNER_KEYS, check_pass_through, router_arg_fields, server_arg_fields

WEIGHT_SYNC = ("auto", "tensor", "distributed", "disk")
ROUTER_POLICIES = ("cache_aware", "round_robin", "random", "power_of_two", "bucket", "manual", "consistent_hashing",
                   "prefix_hash")


def weight_sync_mode(weight_sync: str, colocate: bool) -> str:
    """auto: from tensors when the engines share the trainer's devices, else over an update group."""
    return weight_sync if weight_sync != "auto" else ("tensor" if colocate else "distributed")


def parse_engine_addr(addr: str) -> Optional[tuple[str, int]]:
    """An external engine's address, "host:port" (slime's form) or "http://host:port" -> (host, port); None if it is
    neither."""
    try:
        parts = urlsplit(addr if "://" in addr else f"http://{addr}")
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "http" or not parts.hostname or port is None or parts.path.strip("/") or parts.query:
        return None
    return parts.hostname, port


def num_engines(c: ClusterConfig, external: Optional[list[str]] = None) -> int:
    """One per external address when the run attaches to engines it did not start; else one per
    cluster.rollout_num_gpus_per_engine of the rollout's GPUs."""
    if external:
        return len(external)
    gpus = c.rollout_num_gpus if c.rollout_num_gpus is not None else c.actor_num_nodes * c.actor_num_gpus_per_node
    return max(gpus // max(c.rollout_num_gpus_per_engine, 1), 1)


def check(rollout: RolloutConfig, cluster: ClusterConfig) -> list[str]:
    r, c = rollout, cluster
    problems = check_pass_through("rollout.sglang", r.sglang, server_arg_fields(), RUNNER_KEYS, "sglang's ServerArgs")
    problems += check_pass_through("rollout.sglang_router", r.sglang_router, router_arg_fields(), ROUTER_RUNNER_KEYS,
                                   "sglang-router's RouterArgs")
    if r.weight_sync not in WEIGHT_SYNC:
        problems.append(f"rollout.weight_sync={r.weight_sync!r} is not one of {list(WEIGHT_SYNC)}")
    if weight_sync_mode(r.weight_sync, c.colocate) == "distributed" and (r.sglang.get("dp_size") or 1) > 1:
        # sglang asserts dp_size == 1 for update groups (tokenizer_control_mixin.update_weights_from_distributed)
        problems.append(f"rollout.weight_sync=distributed needs rollout.sglang.dp_size=1 (got {r.sglang['dp_size']}); "
                        "set rollout.weight_sync=disk or drop rollout.sglang.dp_size")
    if r.sglang_router_policy not in ROUTER_POLICIES:
        problems.append(f"rollout.sglang_router_policy={r.sglang_router_policy!r} is not one of {list(ROUTER_POLICIES)}")
    gpus = c.rollout_num_gpus if c.rollout_num_gpus is not None else c.actor_num_nodes * c.actor_num_gpus_per_node
    if gpus % max(c.rollout_num_gpus_per_engine, 1):
        problems.append(f"cluster.rollout_num_gpus={gpus} is not a multiple of cluster.rollout_num_gpus_per_engine="
                        f"{c.rollout_num_gpus_per_engine}; set cluster.rollout_num_gpus to a multiple of it")
    for key in ("sglang_server_concurrency", "sglang_request_batch_size", "update_weight_buffer_size", "rollout_health_check_max_failures"):
        if getattr(r, key) < 1:
            problems.append(f"rollout.{key}={getattr(r, key)} must be >= 1")
    if r.sglang_max_retries < 0:
        problems.append(f"rollout.sglang_max_retries={r.sglang_max_retries} must be >= 0")
    for key in ("sglang_request_timeout_s", "sglang_server_start_timeout_s", "rollout_health_check_interval"):
        if getattr(r, key) <= 0:
            problems.append(f"rollout.{key}={getattr(r, key)} must be > 0")
    if r.rollout_health_check_first_wait < 0:
        problems.append(f"rollout.rollout_health_check_first_wait={r.rollout_health_check_first_wait} must be >= 0")
    mem = r.sglang.get("mem_fraction_static")
    if mem is not None and not (isinstance(mem, (int, float)) and 0 < mem < 1):
        problems.append(f"rollout.sglang.mem_fraction_static={mem} must be in (0, 1)")
    if r.sglang.get("skip_tokenizer_init") and r.rollout_stop:
        problems.append(f"rollout.rollout_stop={list(r.rollout_stop)} needs the engine's tokenizer, which "
                        "rollout.sglang.skip_tokenizer_init=true turns off; use rollout.rollout_stop_token_ids or set "
                        "rollout.sglang.skip_tokenizer_init=false")
    return problems


def check_post_write(rollout: RolloutConfig, cluster: ClusterConfig) -> list[str]:
    """rollout.custom_update_weight_post_write runs after a disk weight sync writes its files: with any other sync (or
    the local engine, which syncs in memory) it would never run."""
    if not rollout.custom_update_weight_post_write:
        return []
    mode = weight_sync_mode(rollout.weight_sync, cluster.colocate) if rollout.backend == "sglang" else "in memory"
    if mode == "disk":
        return []
    return [f"rollout.custom_update_weight_post_write runs after a disk weight sync writes its files; this run syncs "
            f"{mode} (rollout.backend={rollout.backend}, rollout.weight_sync={rollout.weight_sync}): set "
            "rollout.backend=sglang with rollout.weight_sync=disk, or unset the hook"]


def check_external(rollout: RolloutConfig, cluster: ClusterConfig) -> list[str]:
    """rollout.rollout_external_engine_addrs: engines this run attaches to (and so cannot start, place or restart)."""
    addrs = rollout.rollout_external_engine_addrs
    if addrs is None:
        return []
    key = "rollout.rollout_external_engine_addrs"
    if rollout.backend != "sglang":
        return [f"{key} names SGLang engines; rollout.backend={rollout.backend} starts none: set rollout=sglang or unset {key}"]
    problems = [] if addrs else [f"{key} is empty: give one address per engine (\"host:port\"), or unset it"]
    parsed = [parse_engine_addr(str(a)) for a in addrs]
    for i, (addr, got) in enumerate(zip(addrs, parsed)):
        if got is None:
            problems.append(f"{key}[{i}]={addr!r} is not an engine address: give \"host:port\" or \"http://host:port\"")
    valid = [p for p in parsed if p is not None]
    if len(set(valid)) < len(valid):
        problems.append(f"{key} names an engine twice ({list(addrs)}): each address is one engine")
    if cluster.backend != "local":
        problems.append(f"{key} with cluster.backend={cluster.backend}: attaching to running engines is built for "
                        "cluster.backend=local (the trainer in this process); set cluster.backend=local, or unset the "
                        "key and let Ray place the engines")
    if not os.environ.get(KEY_ENV):
        problems.append(f"{key}: the engines' API key is read from ${KEY_ENV}, which is not set; export the key the "
                        "engines were started with (sglang.launch_server --api-key): engines without one would serve "
                        "and take weights from anyone on the node")
    return problems


def check_external_router(rollout: RolloutConfig) -> list[str]:
    """rollout.sglang_router_ip / rollout.sglang_router_port: a router this run attaches to (and so cannot start or
    configure)."""
    ip, port = rollout.sglang_router_ip, rollout.sglang_router_port
    if ip is None and port is None:
        return []
    if ip is None or port is None:
        given, missing = ("ip", "port") if port is None else ("port", "ip")
        return [f"rollout.sglang_router_{given} is set but rollout.sglang_router_{missing} is not: a router already running is named by both (or unset both, and "
                "the run starts a router of its own)"]
    key = "rollout.sglang_router_ip/rollout.sglang_router_port"
    if rollout.backend != "sglang":
        return [f"{key} names an sglang-router; rollout.backend={rollout.backend} routes nothing: set rollout=sglang or "
                "unset both"]
    problems = []
    if not str(ip).strip() or "/" in str(ip) or " " in str(ip):
        problems.append(f"rollout.sglang_router_ip={ip!r} is not a host: give an IP or a host name (no scheme, no port)")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        problems.append(f"rollout.sglang_router_port={port!r} is not a port: give a number in 1..65535")
    if rollout.sglang_router:
        problems.append(f"rollout.sglang_router={dict(rollout.sglang_router)} configures a router this run starts; the "
                        f"one at {key} runs with the options it was started with: drop rollout.sglang_router")
    default_policy = RolloutConfig.__dataclass_fields__["sglang_router_policy"].default
    if rollout.sglang_router_policy != default_policy:
        problems.append(f"rollout.sglang_router_policy={rollout.sglang_router_policy} picks the policy of a router this "
                        f"run starts; the one at {key} keeps its own: drop the override")
    if not os.environ.get(ROUTER_KEY_ENV):
        problems.append(f"{key}: the router's API key is read from ${ROUTER_KEY_ENV}, which is not set; export the key "
                        "the router was started with (sglang_router.launch_router --api-key): a router without one "
                        "would route anyone's requests, and take anyone's workers")
    return problems
