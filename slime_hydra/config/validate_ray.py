"""What `cluster.backend=ray` can drive today, checked at validation (before Ray, data or models start).

The Ray builder (app/build_ray.py) places torch or megatron train ranks (with PPO's critic on torch ranks) and
in-process `local` engines. SGLang engines owned by Ray actors are issue 22's work; until they land a config
asking for them is refused here, with every key to change, rather than after data
loading at launch. (The megatron layout against the ranks is checked beside the backend: training/megatron/checks.py.)
"""

from __future__ import annotations

from slime_hydra.config.schema import AlgorithmConfig, ClusterConfig, RolloutConfig, TrainConfig

# (config key, value Ray cannot drive yet, what to set instead)
RAY_UNSUPPORTED = (
    ("rollout.backend", "sglang", "rollout=local, or cluster.backend=local (SGLang engines beside one process)"),
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
