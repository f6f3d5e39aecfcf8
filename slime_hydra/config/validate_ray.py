"""What `cluster.backend=ray` can drive today, checked at validation (before Ray, data or models start).

The Ray builder (app/build_ray.py) places torch train ranks or megatron train ranks (orchestration/megatron_group.py),
PPO's critic inside either, and either `local` engines behind a rollout manager actor or SGLang engines
whose servers Ray actors own (orchestration/sglang_engines.py) on the driver's node; any train backend with either
rollout backend (tests/orchestration/test_megatron_sglang.py runs megatron ranks with SGLang engines). Weights reach the
SGLang engines through the driver (train rank 0's HF-named tensors from the object store). Two cases are not driven
yet (issue 22) and are refused here, with every key to change, rather than after data loading at launch: SGLang
engines on more than one node, and a distributed update group (disaggregated engines) on GPUs, which the driver,
holding no GPU, cannot open. The megatron layout against the ranks is checked beside the backend
(training/megatron/checks.py).
"""

from __future__ import annotations

from slime_hydra.config.schema import AlgorithmConfig, ClusterConfig, RolloutConfig, TrainConfig

NOT_YET = "cluster.backend=ray does not drive"  # the start of every refusal here (tests/config/test_experiments.py: PENDING)


def check_ray_pairing(cluster: ClusterConfig, train: TrainConfig, rollout: RolloutConfig, algorithm: AlgorithmConfig,
                      problems: list[str]) -> None:
    if cluster.backend != "ray" or rollout.backend != "sglang":
        return
    if cluster.actor_num_nodes > 1:
        # the engines share the driver's node: loopback URLs and update group, local files and memory for weights
        problems.append(f"{NOT_YET} rollout.backend=sglang on cluster.actor_num_nodes={cluster.actor_num_nodes} nodes yet "
                        "(issue 22: the SGLang engines must share the driver's node): set cluster.actor_num_nodes=1, or "
                        "rollout=local")
    distributed = rollout.weight_sync == "distributed" or (rollout.weight_sync == "auto" and not cluster.colocate)
    if distributed and cluster.device != "cpu":
        # rollout/sglang/checks.py's weight_sync_mode, restated (the config floor does not import the rollout's)
        problems.append(f"{NOT_YET} rollout.weight_sync=distributed (the default with cluster.colocate=false) on "
                        f"cluster.device={cluster.device} yet (issue 22: the update group is opened by the driver, which "
                        "holds no GPU; the NCCL group from the train ranks is not written): set rollout.weight_sync=disk "
                        "(or tensor), cluster.colocate=true, or cluster.device=cpu")
