"""Token sampling: temperature, top-k, top-p. Pure tensor functions.

The returned log-probability is that of the chosen token under softmax(logits / temperature)
over the full vocabulary, which is what the trainer recomputes (as slime does).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def filter_logits(logits: Tensor, top_k: int, top_p: float) -> Tensor:
    """Set logits outside the top-k / nucleus to -inf. logits: [B, V]."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [B, V]
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_tokens(
    logits: Tensor, temperature: float, top_k: int, top_p: float, generator: Optional[torch.Generator] = None
) -> tuple[Tensor, Tensor]:
    """Returns (tokens [B], log_probs [B])."""
    scaled = logits.float() / temperature  # [B, V]
    logp_full = torch.log_softmax(scaled, dim=-1)  # [B, V]
    if top_k == 1:
        tokens = scaled.argmax(dim=-1)
    else:
        probs = torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp_full.gather(-1, tokens[:, None]).squeeze(-1)
