"""Expert-parallel megatron runs of the tiny MoE (model=qwen3_tiny_moe) on CPU ranks over gloo: on Ray-placed ranks (the
orchestration layer's actors), and the same run in one process for the EP=1 reference."""

from __future__ import annotations

import dataclasses
import os

import torch

from tests.support.megatron_cpu import ray_ranks, workers

MOE = ["model=qwen3_tiny_moe", "model.num_layers=2", "train.num_steps_per_rollout=1"]  # 4 experts, top-2, aux loss 1e-3;
# a rollout is one step of the 4 rows (2 micro-batches per rank at DP=2)
LAYOUTS = {  # name -> (ranks, parallelism overrides)
    "ep2": (2, {"expert_model_parallel_size": 2}),  # DP=2, each rank 2 of the 4 experts
    "tp2_ep2": (4, {"tensor_model_parallel_size": 2, "expert_model_parallel_size": 2, "sequence_parallel": True}),
}


def _backend(cfg, hf, parallel: dict, weights=True, seed_offset: int = 0):
    from tests.support.trainers import megatron_backend

    par = dataclasses.replace(cfg.parallelism, **parallel)
    return megatron_backend(hf.state_dict() if weights else None, hf.config, cfg.model, par, cfg.algorithm, cfg.train, 1.0,
                            10, torch.device("cpu"), seed=cfg.seed + seed_offset, max_response_len=8)


def moe_run(cfg, hf, parallel: dict, out_dir: str, tag: str) -> dict:
    """Log-probs, one rollout (2 steps), the HF export and a checkpoint after it, a second rollout; then a fresh backend
    (random weights) that loads the checkpoint and runs the second rollout again."""
    b = _backend(cfg, hf, parallel)
    batch = workers.fixed_batch()
    before = b.compute_log_probs(batch)
    metrics = b.train_rollout(batch)
    b.save_hf(os.path.join(out_dir, f"{tag}_hf"))
    b.save_checkpoint(os.path.join(out_dir, f"{tag}_ckpt"))
    metrics2 = b.train_rollout(batch)
    after2 = b.compute_log_probs(batch)
    resumed = _backend(cfg, hf, parallel, weights=False, seed_offset=1)
    resumed.load_checkpoint(os.path.join(out_dir, f"{tag}_ckpt"))
    return {"before": before, "metrics": metrics, "metrics2": metrics2, "after2": after2,
            "resumed_metrics2": resumed.train_rollout(batch), "resumed_after2": resumed.compute_log_probs(batch)}


def ray_config(name: str, extra: list[str] = ()):
    """The tiny MoE (+ `extra`) under LAYOUTS[name] on as many Ray ranks (cluster.backend=ray; the rollout bundle, unused,
    colocated)."""
    ranks, parallel = LAYOUTS[name]
    return workers.tiny_config([*MOE, *extra, "cluster.backend=ray", f"cluster.actor_num_gpus_per_node={ranks}",
                                "cluster.colocate=true", "cluster.rollout_num_gpus=1",
                                *(f"parallelism.{k}={str(v).lower()}" for k, v in parallel.items())])


def moe_ray_run(group, cfg, out_dir: str, tag: str) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """moe_run on the Ray-placed ranks `group` of `cfg`'s layout (tests/support/megatron_cpu/ray_ranks.py): each rank's
    answers, and the weights the group hands local rollout engines after the first rollout (rank 0's, through the
    object store). The resumed run is a fresh trainer on the same ranks (random weights: the next seed's model; an
    optimizer that never stepped) that loads the checkpoint, as moe_run's is a fresh backend in the same process."""
    batch = workers.fixed_batch()
    ckpt = os.path.join(out_dir, f"{tag}_ckpt")
    ray_ranks.setup(group, cfg, 10, 8, cfg.seed)
    got = {"before": ray_ranks.every_rank(group, "compute_log_probs", batch),
           "metrics": ray_ranks.every_rank(group, "train_rollout", batch)}
    group.save_hf(os.path.join(out_dir, f"{tag}_hf"), None)
    weights = dict(group.named_weights())
    group.save_checkpoint(ckpt)
    got |= {"metrics2": ray_ranks.every_rank(group, "train_rollout", batch),
            "after2": ray_ranks.every_rank(group, "compute_log_probs", batch)}
    ray_ranks.setup(group, cfg, 10, 8, cfg.seed + 1)
    group.load_checkpoint(ckpt)
    got |= {"resumed_metrics2": ray_ranks.every_rank(group, "train_rollout", batch),
            "resumed_after2": ray_ranks.every_rank(group, "compute_log_probs", batch)}
    return [{k: v[rank] for k, v in got.items()} for rank in range(len(got["before"]))], weights


def one_kept_ray_run(group, cfg) -> list[dict]:
    """workers.one_kept_run (one kept row of the step's four) on a fresh trainer of the Ray-placed ranks `group` of
    `cfg`'s layout: each rank's answers."""
    batch = workers.one_kept_batch()
    ray_ranks.setup(group, cfg, 10, 8, cfg.seed)
    metrics = ray_ranks.every_rank(group, "train_rollout", batch)
    return [{"metrics": m, "after": a} for m, a in zip(metrics, ray_ranks.every_rank(group, "compute_log_probs", batch))]
