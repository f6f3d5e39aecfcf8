"""The tiny float64 setup the training tests share: the embedded character tokenizer, a 1-layer Qwen3, 8 hand-built
samples in 4 groups of 2 and their TrainBatch, and a random ragged TrainBatch for data-parallel checks."""

from __future__ import annotations

import copy

import torch

from slime_hydra.algorithms.estimators import compute_advantages
from slime_hydra.config.schema import ModelConfig
from slime_hydra.models.build import build_model
from slime_hydra.models.tokenizer import build_char_tokenizer
from slime_hydra.protocols import TrainBatch
from slime_hydra.training.batch import collate
from slime_hydra.types import Sample

torch.set_num_threads(1)
TOK = build_char_tokenizer()
CPU = torch.device("cpu")
MAX_LEN = 6


def samples() -> list[Sample]:
    """8 samples in 4 groups of 2 with different prompt and response lengths; group 3 agrees (zero advantages)."""
    spec = [("12+34=", "46", 1.0), ("12+34=", "47", 0.0), ("5+5=", "10", 1.0), ("5+5=", "9", 0.0),
            ("7+8=", "15", 0.0), ("7+8=", "1", 1.0), ("1+1=", "2", 1.0), ("1+1=", "3", 1.0)]
    out = []
    for i, (prompt, answer, reward) in enumerate(spec):
        p = TOK.encode(prompt)
        r = TOK.encode(answer) + [TOK.eos_token_id]
        lm = [1] * len(r)
        if i == 4:
            lm[0] = 0  # a masked-out response token
        out.append(Sample(prompt=prompt, prompt_tokens=p, tokens=p + r, response_length=len(r), reward=reward,
                          loss_mask=lm, rollout_log_probs=[-1.5 - 0.3 * j for j in range(len(r))], group_index=i // 2,
                          index=i))
    return out


def make_batch(estimator: str = "grpo", **kw):
    ss = samples()
    batch = collate(ss, torch.zeros(len(ss)), TOK.pad_token_id)
    rewards = torch.tensor([s.reward for s in ss])
    batch.advantages = compute_advantages(estimator, rewards, batch.loss_mask, None, 2, **kw).float()
    return batch


BASE = None


def base_model() -> torch.nn.Module:
    global BASE
    if BASE is None:
        cfg = ModelConfig(num_layers=1, hidden_size=32, ffn_hidden_size=64, num_attention_heads=2, num_query_groups=1,
                          kv_channels=16, dtype="float32")
        BASE = build_model(cfg, TOK, seed=0).double()
    return copy.deepcopy(BASE)


def random_batch(n: int, t: int, vocab: int, seed: int) -> TrainBatch:
    """n random rows of t + 1 tokens with ragged responses (unequal token counts per rank); 2 prompt tokens each."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n, t + 1), generator=g)
    lengths = torch.randint(t // 2, t + 1, (n,), generator=g)  # ragged responses: unequal token counts per rank
    attn = (torch.arange(t + 1)[None] <= lengths[:, None]).long()
    mask = torch.zeros(n, t)
    for i, L in enumerate(lengths.tolist()):
        mask[i, 2:L] = 1.0  # first 2 tokens are the prompt
    adv = torch.randn(n, generator=g)[:, None] * mask
    return TrainBatch(ids, attn, mask, adv)


# the loss / aggregation cases every backend test runs (AlgorithmConfig overrides)
CASES = {
    "grpo-sample_token_mean": dict(),
    "grpo-token_mean": dict(loss_aggregation="token_mean"),
    "grpo-seq_mean_token_sum": dict(loss_aggregation="seq_mean_token_sum"),
    "dr_grpo-seq_mean_token_sum_norm": dict(loss_aggregation="seq_mean_token_sum_norm", grpo_std_normalization=False),
    "gspo": dict(advantage_estimator="gspo", eps_clip=3e-4, eps_clip_high=4e-4),
    "cispo-token_mean": dict(advantage_estimator="cispo", eps_clip=1.0, eps_clip_high=4.0, loss_aggregation="token_mean"),
    "tis-seq_mean_token_sum_norm": dict(use_tis=True, loss_aggregation="seq_mean_token_sum_norm"),
    "kl_loss-unbiased-entropy": dict(use_kl_loss=True, kl_loss_coef=0.1, use_unbiased_kl=True, entropy_coef=0.01),
    "rollout_logprobs-dual_clip": dict(use_rollout_logprobs=True, eps_clip_c=3.0),
    "reinforce_plus_plus_baseline": dict(advantage_estimator="reinforce_plus_plus_baseline", normalize_advantages=True),
}
