"""Torch data-parallel ranks outside Ray for the tests: each spawned process is a train_group.TrainRank (the class a
Ray actor wraps) in a gloo world, given its share of the batch as the driver splits it (split_for_ranks)."""

from __future__ import annotations

import os
import time

import torch

# one optimizer step of 32 samples (8 prompts x 4); every sample but row 0 has a zero advantage, so
# train.skip_zero_advantage_samples keeps one sample of the step and, at DP=2, rank 1's share keeps none
ONE_KEPT = ["logger.progress_bar=false", "warmstart.steps=0", "rollout.rollout_batch_size=8", "rollout.n_samples_per_prompt=4",
            "train.micro_batch_size=4", "train.num_steps_per_rollout=1", "train.skip_zero_advantage_samples=true",
            "train.lr=1e-2", "eval.eval_interval=null"]
TIMEOUT_S = 600.0  # cluster.distributed_timeout_s of the spawned ranks: past the test's deadline, so a wait shows as one


def one_kept_batch():
    from tests.support.tiny import random_batch

    batch = random_batch(32, 10, 40, seed=0)
    batch.advantages[1:] = 0
    return batch


def one_kept_single():
    """(metrics, parameters before, parameters after) of one process training on the whole step."""
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.models.build import build_model, build_tokenizer
    from tests.support.trainers import torch_backend

    cfg = compose_run(ONE_KEPT)
    b = torch_backend(build_model(cfg.model, build_tokenizer(cfg.model), cfg.seed), cfg.algorithm, cfg.train, 1.0, 1,
                      torch.device("cpu"), max_response_len=cfg.rollout.rollout_max_response_len, model_impl=cfg.model.model_impl)
    before = [p.detach().clone() for p in b.params]
    metrics = b.train_rollout(one_kept_batch())
    return metrics, before, [p.detach().clone() for p in b.params]


def one_kept_rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    """A spawned rank: its share of the one-kept step, its metrics and parameters saved to out_dir. Like a Ray actor it
    stays up until every rank has its result, so a rank left in a collective waits there (it is not told that its
    peer exited)."""
    from slime_hydra.app.algorithm import algorithm_specs
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.orchestration.train_group import TrainRank, split_for_ranks

    cfg = compose_run(ONE_KEPT)
    r = TrainRank(rank, world, use_gpu=False, num_threads=1, tracking_uri=None, run_id=None)
    r.setup(f"tcp://127.0.0.1:{port}", TIMEOUT_S, cfg.model,
            algorithm_specs(cfg.algorithm, cfg.train, 1, cfg.rollout.rollout_max_response_len), 1.0, cfg.seed)
    metrics = r.train_rollout(split_for_ranks(one_kept_batch(), 1, world)[rank])
    path = os.path.join(out_dir, f"one_kept_rank{rank}.pt")
    torch.save({"metrics": metrics, "params": r.parameters()}, path + ".part")
    os.replace(path + ".part", path)
    deadline = time.monotonic() + TIMEOUT_S
    while not all(os.path.exists(os.path.join(out_dir, f"one_kept_rank{q}.pt")) for q in range(world)):
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    r.shutdown()
