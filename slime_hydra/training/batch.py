"""Samples -> TrainBatch (padding and masks). The only place token lists become tensors."""

from __future__ import annotations

import torch

from slime_hydra.protocols import TrainBatch
from slime_hydra.types import Sample


def collate(samples: list[Sample], advantages: torch.Tensor, pad_id: int) -> TrainBatch:
    """advantages: [N] per sample (broadcast to response tokens) or [N, T] per token."""
    t1 = max(len(s.tokens) for s in samples)  # T + 1
    ids, attn, mask, rlp = [], [], [], []  # rows as lists: one tensor per field, not per sample
    for s in samples:
        L, R = len(s.tokens), s.response_length
        lm = list(s.loss_mask) if s.loss_mask is not None else [1] * R
        lp = list(s.rollout_log_probs) if s.rollout_log_probs is not None else [0.0] * R
        before, after = [0] * (L - 1 - R), [0] * (t1 - L)  # position t predicts token t+1
        ids.append(list(s.tokens) + [pad_id] * (t1 - L))
        attn.append([1] * L + after)
        mask.append(before + lm + after)
        rlp.append(before + lp + after)
    mask_t = torch.tensor(mask, dtype=torch.float32)  # [N, T]
    adv = advantages[:, None] * mask_t if advantages.dim() == 1 else advantages
    return TrainBatch(torch.tensor(ids, dtype=torch.long), torch.tensor(attn, dtype=torch.long), mask_t, adv.float(),
                      torch.tensor(rlp, dtype=torch.float32))
