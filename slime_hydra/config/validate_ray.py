"""What `cluster.backend=ray` can drive today, checked at validation (before Ray, data or models start).

The Ray builder (app/build_ray.py) places torch train ranks (PPO's critic too) or megatron train ranks
(orchestration/megatron_group.py), and either `local` engines behind a rollout manager actor or SGLang engines
whose servers Ray actors own (orchestration/sglang_engines.py) on the driver's node. Two cases are not driven yet
(issue 22) and are refused here, with every key to change, rather than after data loading at launch: SGLang
engines on more than one node, and megatron ranks together with SGLang engines (each half runs and is tested
under Ray on CPU; the pair has not run together, on CPU or GPU). The megatron layout against the ranks is
checked beside the backend (training/megatron/checks.py).
"""

from __future__ import annotations

from slime_hydra.config.schema import AlgorithmConfig, ClusterConfig, RolloutConfig, TrainConfig

NOT_YET = "cluster.backend=ray does not drive"  # the start of every refusal here (tests/config/test_experiments.py: PENDING)


def check_ray_pairing(cluster: ClusterConfig, train: TrainConfig, rollout: RolloutConfig, algorithm: AlgorithmConfig,
                      problems: list[str]) -> None:
    if cluster.backend != "ray" or rollout.backend != "sglang":
        return
    if train.backend == "megatron":
        problems.append(f"{NOT_YET} train.backend=megatron with rollout.backend=sglang yet (issue 22: megatron ranks run "
                        "under Ray with rollout=local, and SGLang engines with train=torch; the pair has not run together): "
                        "set rollout=local or train=torch, or cluster.backend=local (both in one process)")
    if cluster.actor_num_nodes > 1:
        # the engines share the driver's node: loopback URLs and update group, local files and memory for weights
        problems.append(f"{NOT_YET} rollout.backend=sglang on cluster.actor_num_nodes={cluster.actor_num_nodes} nodes yet "
                        "(issue 22: the SGLang engines must share the driver's node): set cluster.actor_num_nodes=1, or "
                        "rollout=local")
