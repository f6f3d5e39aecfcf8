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


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """probs [B, V] (rows need not sum to exactly 1), u [B] in [0, 1] -> [B]: the first index whose cumulative
    mass exceeds u * total. A zero-probability index is never taken (its cumulative mass equals its
    predecessor's); where u * total reaches the total (u = 1, or rounding), the last index with mass is."""
    cdf = probs.cumsum(-1)  # [B, V]
    total = cdf[:, -1:].contiguous()  # [B, 1]
    drawn = torch.searchsorted(cdf, u[:, None].to(cdf.dtype) * total, right=True)  # [B, 1] first cdf > u * total
    last = torch.searchsorted(cdf, total)  # [B, 1] first cdf >= total: the last index with mass
    return torch.minimum(drawn, last).squeeze(-1)


def inverse_cdf_sample(probs: Tensor, generator: Optional[torch.Generator] = None) -> Tensor:
    """One index per row, drawn with probability probs[b] / probs[b].sum(): one uniform per row, on CPU ~4x
    cheaper than torch.multinomial (56 vs 234 us for [256, 14], 2 threads). [B, V] -> [B]."""
    u = torch.rand(len(probs), generator=generator, dtype=torch.promote_types(probs.dtype, torch.float32), device=probs.device)
    return inverse_cdf(probs, u)


def sample_tokens(
    logits: Tensor, temperature: float, top_k: int, top_p: float, generator: Optional[torch.Generator] = None
) -> tuple[Tensor, Tensor]:
    """Returns (tokens [B], log_probs [B])."""
    scaled = logits.float() / temperature  # [B, V]
    logp_full = torch.log_softmax(scaled, dim=-1)  # [B, V]
    if top_k == 1:
        tokens = scaled.argmax(dim=-1)
    else:
        filtered = filter_logits(scaled, top_k, top_p)
        probs = logp_full.exp() if filtered is scaled else torch.softmax(filtered, dim=-1)  # [B, V]
        tokens = inverse_cdf_sample(probs, generator)
    return tokens, logp_full.gather(-1, tokens[:, None]).squeeze(-1)
