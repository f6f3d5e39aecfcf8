"""Multi-process megatron runs on CPU (gloo) for the tests: one function per spawned rank."""

from __future__ import annotations

import os

import torch

LAYOUTS = {  # name -> parallelism overrides (2 processes: what is not TP or PP is DP)
    "tp2": {"tensor_model_parallel_size": 2},
    "tp2_sp": {"tensor_model_parallel_size": 2, "sequence_parallel": True},  # the norms' gradients summed over TP
    "pp2": {"pipeline_model_parallel_size": 2},
    "dp2": {"use_distributed_optimizer": True},
}


def tiny_config(overrides: list[str] = ()):
    """The embedded default with the megatron trainer: 2 optimizer steps of 4 rows a rollout, micro-batches of 1."""
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.config.store import register

    register()
    return compose_run(["train=megatron", "train.num_steps_per_rollout=2", "train.micro_batch_size=1", "train.lr=1e-3",
                        "rollout.rollout_batch_size=1", "rollout.n_samples_per_prompt=4", *overrides])


def tiny_setup(overrides: list[str] = ()):
    """(cfg, tokenizer, HF model) of tiny_config(overrides)."""
    from slime_hydra.models.build import build_model, build_tokenizer

    cfg = tiny_config(overrides)
    tok = build_tokenizer(cfg.model)
    return cfg, tok, build_model(cfg.model, tok, cfg.seed)


def fixed_batch():
    """4 right-padded sequences of the char vocabulary, responses on the last positions, mixed advantages."""
    from slime_hydra.protocols import TrainBatch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 59, (4, 14), generator=g)
    attn = torch.ones_like(ids)
    attn[3, 11:] = 0  # one shorter sequence
    ids[3, 11:] = 0
    loss_mask = torch.zeros(4, 13)
    loss_mask[:, 6:] = 1
    loss_mask[3, 10:] = 0
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2]).unsqueeze(1) * loss_mask
    return TrainBatch(ids, attn, loss_mask, adv)


def run_layout(cfg, hf, parallel, out_dir: str, tag: str) -> dict:
    """Convert, export, one train_rollout, log-probs after it; returns this rank's results."""
    import dataclasses

    from tests.support.trainers import megatron_backend

    par = dataclasses.replace(cfg.parallelism, **parallel)
    b = megatron_backend(hf.state_dict(), hf.config, cfg.model, par, cfg.algorithm, cfg.train, 1.0, 10,
                             torch.device("cpu"), seed=cfg.seed, max_response_len=8)
    batch = fixed_batch()
    before = b.compute_log_probs(batch)
    b.save_hf(os.path.join(out_dir, f"{tag}_hf_before"))
    metrics = b.train_rollout(batch)
    after = b.compute_log_probs(batch)
    b.save_checkpoint(os.path.join(out_dir, f"{tag}_ckpt"))  # megatron dist checkpoint after one rollout
    metrics2 = b.train_rollout(batch)
    return {"before": before, "after": after, "metrics": metrics, "after2": b.compute_log_probs(batch), "metrics2": metrics2,
            "dtypes": dtypes(b), "sft": sft_steps(b, batch)}


def sft_steps(b, batch) -> dict:
    """Two SFT warm-start steps (lr 1e-3): their losses, and the gradient norms megatron's optimizer computed (before
    clipping; sft_step returns only the loss, so the backend's optimizer step is watched, not changed)."""
    norms = []
    step = b.runner.optimizer_step
    b.runner.optimizer_step = lambda optimizer, lr: norms.append(step(optimizer, lr)) or norms[-1]
    losses = [b.sft_step(batch, 1e-3) for _ in range(2)]
    return {"losses": losses, "grad_norms": norms}


def train_twice(cfg, hf) -> dict:
    """Log-probs before and after two train_rollouts of one TP=PP=DP=1 backend (no checkpoint)."""
    from tests.support.trainers import megatron_backend

    b = megatron_backend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, cfg.algorithm, cfg.train, 1.0, 10,
                             torch.device("cpu"), seed=cfg.seed, max_response_len=8)
    batch = fixed_batch()
    before = b.compute_log_probs(batch)
    b.train_rollout(batch)
    b.train_rollout(batch)
    return {"before": before, "after2": b.compute_log_probs(batch)}


def resume_layout(cfg, hf, parallel, ckpt_dir: str) -> dict:
    """A fresh backend (random weights) that loads `ckpt_dir`, then one more train_rollout."""
    import dataclasses

    from tests.support.trainers import megatron_backend

    par = dataclasses.replace(cfg.parallelism, **parallel)
    b = megatron_backend(None, hf.config, cfg.model, par, cfg.algorithm, cfg.train, 1.0, 10,
                             torch.device("cpu"), seed=cfg.seed + 1, max_response_len=8)
    b.load_checkpoint(ckpt_dir)
    batch = fixed_batch()
    loaded = b.compute_log_probs(batch)
    metrics2 = b.train_rollout(batch)
    return {"loaded": loaded, "after2": b.compute_log_probs(batch), "steps_done": b.steps_done, "metrics2": metrics2,
            "dtypes": dtypes(b)}


def warm_start_then_still_step(cfg, hf, parallel) -> dict:
    """Log-probs before and after two SFT steps (lr 1e-3), and after one RL rollout at lr 0 that follows them."""
    import dataclasses

    from tests.support.trainers import megatron_backend

    par = dataclasses.replace(cfg.parallelism, **parallel)
    still = dataclasses.replace(cfg.train, lr=0.0, min_lr=0.0)
    b = megatron_backend(hf.state_dict(), hf.config, cfg.model, par, cfg.algorithm, still, 1.0, 10,
                             torch.device("cpu"), seed=cfg.seed, max_response_len=8)
    batch = fixed_batch()
    before = b.compute_log_probs(batch)
    for _ in range(2):
        b.sft_step(batch, 1e-3)
    b.end_warm_start()
    warm = b.compute_log_probs(batch)
    b.train_rollout(batch)
    return {"before": before, "warm": warm, "after": b.compute_log_probs(batch)}


def dtypes(b) -> dict[str, set]:
    """The dtypes a backend holds: model parameters, the optimizer's (main) parameters, its Adam moments."""
    opts = [o.optimizer for o in getattr(b.optimizer, "chained_optimizers", [b.optimizer])]
    main = [p for o in opts for g in o.param_groups for p in g["params"]]
    moments = [t for o in opts for st in o.state.values() for k, t in st.items() if k in ("exp_avg", "exp_avg_sq")]
    return {"model": {p.dtype for p in b.gpt.parameters()}, "main": {p.dtype for p in main},
            "moments": {t.dtype for t in moments}, "num_moments": len(moments), "num_main": len(main)}


def rank_setup(rank: int, world: int, port: int, overrides: list[str] = ()):
    """A spawned rank joins the gloo world on `port`, one thread, the shim installed: tiny_setup(overrides)."""
    from tests.support.megatron_cpu import shim

    shim.install()
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    return tiny_setup(overrides)


def spawn_main(rank: int, world: int, port: int, out_dir: str, layouts: list[str]) -> None:
    cfg, _, hf = rank_setup(rank, world, port)
    for name in layouts:
        res = run_layout(cfg, hf, LAYOUTS[name], out_dir, name)
        torch.save(res, os.path.join(out_dir, f"{name}_rank{rank}.pt"))


def uneven_batch():
    """workers.fixed_batch with row 1 cut to 10 tokens: rows of 14, 10, 14, 11 tokens."""
    batch = fixed_batch()
    batch.attention_mask[1, 10:] = 0
    batch.input_ids[1, 10:] = 0
    batch.loss_mask[1, 9:] = 0
    batch.advantages = batch.advantages * batch.loss_mask
    return batch


# -- PPO's critic (tests/training/megatron/test_critic.py) ----------------------------------------------------------------
PPO = ["algorithm=ppo", "train.num_steps_per_rollout=1", "train.critic_lr=1e-2"]  # 1 step of 4 rows, 4 micro-batches
PPO_RETURNS = torch.tensor([1.0, 0.0, 1.0, 0.5])  # per row: the critic's target G on every mask position


def critic_steps(b, ckpt: str | None = None) -> dict:
    """values -> train_rollout -> values, twice, on fixed_batch with returns PPO_RETURNS (the old values: the critic's);
    `ckpt`: a megatron checkpoint written after the first rollout."""
    batch = fixed_batch()
    batch.returns = PPO_RETURNS[:, None] * batch.loss_mask
    values, metrics = [b.values(batch)], []
    for r in range(2):
        batch.values = values[-1]
        metrics.append(b.train_rollout(batch))
        if r == 0 and ckpt is not None:
            b.save_checkpoint(ckpt)
        values.append(b.values(batch))
    return {"values": values, "metrics": metrics}


def critic_run(cfg, hf, parallel, out_dir: str, tag: str) -> dict:
    """A PPO megatron backend (reference frozen: the critic copied from the policy) through critic_steps."""
    import dataclasses

    from tests.support.trainers import megatron_backend

    par = dataclasses.replace(cfg.parallelism, **parallel)
    b = megatron_backend(hf.state_dict(), hf.config, cfg.model, par, cfg.algorithm, cfg.train, 1.0, 10,
                         torch.device("cpu"), seed=cfg.seed, max_response_len=8)
    b.freeze_reference()
    return critic_steps(b, None if out_dir is None else os.path.join(out_dir, f"{tag}_ckpt"))


def critic_resume(cfg, hf, parallel, ckpt_dir: str) -> dict:
    """A fresh PPO backend (random weights) that loads `ckpt_dir`: its values, then one more rollout."""
    import dataclasses

    from tests.support.trainers import megatron_backend

    par = dataclasses.replace(cfg.parallelism, **parallel)
    b = megatron_backend(None, hf.config, cfg.model, par, cfg.algorithm, cfg.train, 1.0, 10,
                         torch.device("cpu"), seed=cfg.seed + 1, max_response_len=8)
    b.load_checkpoint(ckpt_dir)
    batch = fixed_batch()
    batch.returns = PPO_RETURNS[:, None] * batch.loss_mask
    batch.values = loaded = b.values(batch)
    metrics = b.train_rollout(batch)
    return {"loaded": loaded, "metrics": metrics, "after": b.values(batch), "counters": b._counters()}


def critic_spawn_main(rank: int, world: int, port: int, out_dir: str, layouts: list[str]) -> None:
    cfg, _, hf = rank_setup(rank, world, port, PPO)
    for name in layouts:
        res = critic_run(cfg, hf, LAYOUTS[name], out_dir, f"critic_{name}")
        torch.save(res, os.path.join(out_dir, f"critic_{name}_rank{rank}.pt"))


KL = ["algorithm.use_kl_loss=true", "algorithm.kl_loss_coef=1.0"]  # the KL term as large as the policy loss


def kl_run(cfg, hf, parallel) -> dict:
    """Two rollouts with the KL loss against the reference frozen before them (2 optimizer steps each): the first step
    sits at the reference (KL 0), every later one away from it."""
    import dataclasses

    from tests.support.trainers import megatron_backend

    par = dataclasses.replace(cfg.parallelism, **parallel)
    b = megatron_backend(hf.state_dict(), hf.config, cfg.model, par, cfg.algorithm, cfg.train, 1.0, 10,
                         torch.device("cpu"), seed=cfg.seed, max_response_len=8)
    b.freeze_reference()
    batch = fixed_batch()
    metrics = [b.train_rollout(batch), b.train_rollout(batch)]
    return {"metrics": metrics, "after": b.compute_log_probs(batch)}


def kl_spawn_main(rank: int, world: int, port: int, out_dir: str, layouts: list[str]) -> None:
    cfg, _, hf = rank_setup(rank, world, port, KL)
    for name in layouts:
        torch.save(kl_run(cfg, hf, LAYOUTS[name]), os.path.join(out_dir, f"kl_{name}_rank{rank}.pt"))


ONE_KEPT = ["train.skip_zero_advantage_samples=true", "train.num_steps_per_rollout=1"]


def one_kept_batch():
    """The fixed batch with every advantage but row 0's zeroed: skip_zero_advantage_samples keeps one row of the
    step, so at DP=2 one rank's share is empty."""
    batch = fixed_batch()
    batch.advantages[1:] = 0
    return batch


def one_kept_run(cfg, hf, parallel) -> dict:
    import dataclasses

    from tests.support.trainers import megatron_backend

    par = dataclasses.replace(cfg.parallelism, **parallel)
    b = megatron_backend(hf.state_dict(), hf.config, cfg.model, par, cfg.algorithm, cfg.train, 1.0, 10,
                         torch.device("cpu"), seed=cfg.seed, max_response_len=8)
    batch = one_kept_batch()
    metrics = b.train_rollout(batch)
    return {"metrics": metrics, "after": b.compute_log_probs(batch)}


def one_kept_spawn_main(rank: int, world: int, port: int, out_dir: str, layouts: list[str]) -> None:
    cfg, _, hf = rank_setup(rank, world, port, ONE_KEPT)
    for name in layouts:
        torch.save(one_kept_run(cfg, hf, LAYOUTS[name]), os.path.join(out_dir, f"one_kept_{name}_rank{rank}.pt"))
