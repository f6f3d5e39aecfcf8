"""Step-hook plug-ins the tests name by `_target_` (tests.support.step_hooks.<name>). Each is also the example of its key in
docs/customization.md: tests/static/test_customization_doc.py checks that the doc shows exactly this source."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import torch

from slime_hydra.data.dataset import Prompt
from slime_hydra.data.source import prompt_group


def rejection_tis(pg_loss, old_log_probs, rollout_log_probs, mask, max_ratio=2.0):
    """Importance weights exp(old - rollout); a token whose weight is over max_ratio is rejected (masked out)."""
    ratio = torch.exp(old_log_probs - rollout_log_probs).detach()  # [n, T]
    rejected = (ratio > max_ratio).to(mask.dtype)
    return pg_loss * ratio, mask * (1 - rejected), {"tis_rejected": rejected}


def constant_sum_reducer(pg_loss, mask, denom, constant=8.0):
    """Dr.GRPO's reduction: every token's loss summed, over (samples in the step) x a constant length."""
    return (pg_loss * mask).sum() / (denom * constant)


def rank_rewards(samples, group_size):
    """Each sample's reward replaced by its rank within its group (0 = lowest; ties by order)."""
    out = []
    for g in range(0, len(samples), group_size):
        group = samples[g:g + group_size]
        order = sorted(range(len(group)), key=lambda i: group[i].reward)
        ranks = {i: float(r) for r, i in enumerate(order)}
        out += [ranks[i] for i in range(len(group))]
    return out


def log_best_reward(rollout_id, samples, metrics, rollout_time, name="custom/best_reward"):
    """One more metric per rollout: the best reward of the rollout."""
    return {name: max(s.reward for s in samples)}


def log_eval_sizes(step, samples, metrics):
    """One more metric per eval set: how many samples it scored."""
    return {f"custom/{name}_samples": len(group) for name, group in samples.items()}


class AdditionSource:
    """Serves its own prompts: "a+b=" with a, b drawn from a seeded generator; its state is the generator's position."""

    def __init__(self, prompts, tokenizer, n_samples_per_prompt, seed, max_operand=9):
        self.tokenizer, self.n, self.seed, self.max_operand = tokenizer, n_samples_per_prompt, seed, max_operand
        self.served = 0  # groups served so far

    def next_groups(self, num_groups):
        groups = []
        for _ in range(num_groups):
            rng = random.Random(self.seed * 1_000_003 + self.served)
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            text = f"{a}+{b}="
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            prompt = Prompt(prompt=text, text=text, tokens=tokens, label=str(a + b))
            groups.append(prompt_group(prompt, self.served, self.n))
            self.served += 1
        return groups

    def metrics(self):
        return {"data/custom_groups_served": float(self.served)}

    def state_dict(self):
        return {"served": self.served}

    def load_state_dict(self, state):
        self.served = state["served"]


async def greedy_eval(step, rollout, prompts, n_samples, sampling):
    """Eval samples decoded greedily (top_k=1): a prompt's n samples are one answer n times."""
    samples = [s for i, p in enumerate(prompts) for s in prompt_group(p, i, n_samples)]
    return await rollout.generate(samples, dataclasses.replace(sampling, top_k=1))


def record_init(path):
    """After megatron's setup, on every rank: note the rank."""
    rank = torch.distributed.get_rank()
    with open(f"{path}.rank{rank}", "a") as f:
        f.write("init\n")


def record_log_prob_pass(model, store_prefix, path):
    """Before each forward-only log-prob pass: note whose log-probs it computes."""
    with open(path, "a") as f:
        f.write(json.dumps({"store_prefix": store_prefix, "chunks": len(model)}) + "\n")


def record_train_step(rollout_id, step_id, model, optimizer, path):
    """Before each optimizer step of the policy: note the rollout, the step and the learning rate it will take."""
    with open(path, "a") as f:
        f.write(json.dumps({"rollout_id": rollout_id, "step_id": step_id, "chunks": len(model),
                            "param_groups": len(optimizer.param_groups)}) + "\n")


def record_post_write(version_dir, version, path):
    """After a disk weight sync wrote its files: note the directory and version (a shared file system would publish)."""
    files = sorted(f.name for f in Path(version_dir).glob("*.safetensors"))
    with open(path, "a") as f:
        f.write(json.dumps({"version": version, "files": files}) + "\n")
