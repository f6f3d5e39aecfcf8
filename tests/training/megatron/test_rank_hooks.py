"""slime's megatron hooks (train.custom_megatron_init, _before_log_prob_hook, _before_train_step_hook) at their points of
the megatron trainer, in one process under the CPU shim: init once the process groups exist, a log-prob hook before each
forward-only log-prob pass with slime's store prefix, a train-step hook before each optimizer step with the rollout and
the step's index within it."""

from __future__ import annotations

import dataclasses
import json

import torch

from tests.support.megatron_cpu import shim, workers


def records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_megatron_hooks_run_at_their_points(tmp_path):
    """2 rollouts of 2 optimizer steps: the old log-probs of each rollout's second step are one forward-only pass
    (store_prefix ""), and a shaping KL (algorithm.kl_coef) asks for the policy's, then the reference's ("ref_");
    the train-step hook sees (rollout, step) = (0, 0), (0, 1), (1, 0), (1, 1), with the one model chunk and the policy
    optimizer's parameter groups."""
    from tests.support.trainers import megatron_backend

    shim.install()
    init, log_prob, step = tmp_path / "init", tmp_path / "log_prob.jsonl", tmp_path / "step.jsonl"
    hook = "++train.custom_megatron_{}={{_target_:tests.support.step_hooks.{},path:'{}'}}"
    cfg, _, hf = workers.tiny_setup([hook.format("init", "record_init", init),
                                     hook.format("before_log_prob_hook", "record_log_prob_pass", log_prob),
                                     hook.format("before_train_step_hook", "record_train_step", step)])
    trainer = megatron_backend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, cfg.algorithm, cfg.train, 1.0, 10,
                               torch.device("cpu"), seed=cfg.seed)
    assert (tmp_path / "init.rank0").read_text() == "init\n" and not log_prob.exists() and not step.exists()
    for _ in range(2):
        trainer.train_rollout(workers.fixed_batch())
    assert records(log_prob) == [{"store_prefix": "", "chunks": 1}] * 2
    groups = len(trainer.optimizer.param_groups)
    assert records(step) == [{"rollout_id": r, "step_id": s, "chunks": 1, "param_groups": groups} for r in (0, 1) for s in (0, 1)]
    trainer.loss = dataclasses.replace(trainer.loss, keep_reference=True)  # as algorithm.kl_coef != 0 builds it
    trainer.freeze_reference()
    trainer.reward_kl(workers.fixed_batch())  # the shaping KL: the policy's old log-probs, then the reference's
    assert [r["store_prefix"] for r in records(log_prob)[2:]] == ["", "ref_"]
