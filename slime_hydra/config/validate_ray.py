"""What `cluster.backend=ray` can drive today, checked at validation (before Ray, data or models start).

The Ray driver (orchestration/driver.py) places torch train ranks, in-process `local` engines, and SGLang
engines owned by Ray actors (orchestration/sglang_engines.py) on the driver's node. Megatron ranks as Ray
actors and the critic's all-reduce over data-parallel ranks are issue 22's remaining work; until they land a
config asking for them is refused here, with every key to change, rather than after data loading at launch.
"""

from __future__ import annotations

from slime_hydra.config.schema import AlgorithmConfig, ClusterConfig, RolloutConfig, TrainConfig

# (config key, value Ray cannot drive yet, what to set instead)
RAY_UNSUPPORTED = (
    ("train.backend", "megatron", "train=torch, or cluster.backend=local (megatron in one process)"),
    ("algorithm.advantage_estimator", "ppo", "a critic-free algorithm (grpo, gspo, reinforce_plus_plus, ...), or cluster.backend=local"),
)


def check_ray_pairing(cluster: ClusterConfig, train: TrainConfig, rollout: RolloutConfig, algorithm: AlgorithmConfig,
                      problems: list[str]) -> None:
    if cluster.backend != "ray":
        return
    values = {"train.backend": train.backend, "rollout.backend": rollout.backend,
              "algorithm.advantage_estimator": algorithm.advantage_estimator}
    for key, value, fix in RAY_UNSUPPORTED:
        if values[key] == value:
            problems.append(f"cluster.backend=ray does not drive {key}={value} yet (issue 22): set {fix}")
    if rollout.backend == "sglang" and cluster.actor_num_nodes > 1:
        # the engines share the driver's node: loopback URLs and update group, local files and memory for weights
        problems.append(f"cluster.backend=ray does not drive rollout.backend=sglang on cluster.actor_num_nodes="
                        f"{cluster.actor_num_nodes} nodes yet (issue 22: the SGLang engines must share the driver's node): "
                        "set cluster.actor_num_nodes=1, or rollout=local")
