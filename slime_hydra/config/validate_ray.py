"""What `cluster.backend=ray` can drive today, checked at validation (before Ray, data or models start).

The Ray builder (app/build_ray.py) places torch train ranks or megatron train ranks (orchestration/megatron_group.py),
PPO's critic inside either, and either `local` engines behind a rollout manager actor or SGLang engines
whose servers Ray actors own (orchestration/sglang_engines.py) on the driver's node; any train backend with either
rollout backend (tests/orchestration/test_megatron_sglang.py runs megatron ranks with SGLang engines). Weights reach the
SGLang engines from the train ranks (orchestration/rank_weights.py): handles to their tensors when colocated, and over
update groups the ranks open (NCCL on GPUs, gloo on CPU) otherwise; with megatron's PP>1 a rank holds one stage only,
and the driver sends train rank 0's gathered tensors from the object store. Three cases are not driven yet and are
refused here, with every key to change, rather than after data loading at launch: SGLang engines on more
than one node; on GPUs, an update group with PP>1 (the driver, holding no GPU, would be rank 0: per-stage senders are
not written); and on GPUs, an update group to colocated engines (NCCL refuses two ranks of a group on one GPU). The
megatron layout against the ranks is checked beside the backend (training/megatron/checks.py).
"""

from __future__ import annotations

from slime_hydra.config.schema import AlgorithmConfig, ClusterConfig, ParallelismConfig, RolloutConfig, TrainConfig

NOT_YET = "cluster.backend=ray does not drive"  # the start of every refusal here (tests/config/test_experiments.py: PENDING)


def check_ray_pairing(cluster: ClusterConfig, train: TrainConfig, rollout: RolloutConfig, algorithm: AlgorithmConfig,
                      parallelism: ParallelismConfig, problems: list[str]) -> None:
    if cluster.backend != "ray" or rollout.backend != "sglang":
        return
    if cluster.actor_num_nodes > 1:
        # the engines share the driver's node: loopback URLs and update group, local files and memory for weights
        problems.append(f"{NOT_YET} rollout.backend=sglang on cluster.actor_num_nodes={cluster.actor_num_nodes} nodes yet "
                        "(the SGLang engines must share the driver's node): set cluster.actor_num_nodes=1, or "
                        "rollout=local")
    # rollout/sglang/checks.py's weight_sync_mode, restated (the config floor does not import the rollout's)
    distributed = rollout.weight_sync == "distributed" or (rollout.weight_sync == "auto" and not cluster.colocate)
    if not distributed or cluster.device == "cpu":
        return
    pp = parallelism.pipeline_model_parallel_size if train.backend == "megatron" else 1
    if pp > 1:
        problems.append(f"{NOT_YET} rollout.weight_sync=distributed (the default with cluster.colocate=false) with "
                        f"parallelism.pipeline_model_parallel_size={pp} on cluster.device={cluster.device} yet (a "
                        "rank holds one pipeline stage, so the driver would be the group's rank 0, and it holds no GPU): set "
                        "parallelism.pipeline_model_parallel_size=1, rollout.weight_sync=disk, or cluster.device=cpu")
    if cluster.colocate:
        problems.append(f"{NOT_YET} rollout.weight_sync=distributed with cluster.colocate=true on cluster.device="
                        f"{cluster.device} (a train rank and its engine share a GPU, and NCCL refuses two ranks of a group "
                        "on one GPU): set rollout.weight_sync=auto (tensor when colocated), or cluster.colocate=false")
