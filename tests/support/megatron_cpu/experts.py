"""Expert-parallel megatron runs of the tiny MoE (model=qwen3_tiny_moe) on CPU ranks over gloo: one function per spawned
rank, and the same run in one process for the EP=1 reference."""

from __future__ import annotations

import dataclasses
import os

import torch

from tests.support.megatron_cpu import workers

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


def moe_spawn_main(rank: int, world: int, port: int, out_dir: str, name: str) -> None:
    cfg, _, hf = workers.rank_setup(rank, world, port, MOE)
    torch.save(moe_run(cfg, hf, LAYOUTS[name][1], out_dir, name), os.path.join(out_dir, f"{name}_rank{rank}.pt"))


def one_kept_spawn_main(rank: int, world: int, port: int, out_dir: str, name: str) -> None:
    """workers.one_kept_run (one kept row of the step's four) of the tiny MoE under LAYOUTS[name]."""
    cfg, _, hf = workers.rank_setup(rank, world, port, [*MOE, *workers.ONE_KEPT])
    torch.save(workers.one_kept_run(cfg, hf, LAYOUTS[name][1]), os.path.join(out_dir, f"one_kept_{name}_rank{rank}.pt"))
