"""A rank's samples -> micro-batches: `micro_batch_size` samples each, or by a token budget (slime's
`--use-dynamic-batch-size --max-tokens-per-gpu`).

The budget bounds a micro-batch's cost: its padded tokens (rows × longest row) where the forward pads
to the longest sample (transformers, megatron), its real tokens where it packs (model.model_impl=native).
The packing is balanced longest-first (LPT): samples in order of decreasing length, each into the
micro-batch it makes cheapest, among k micro-batches, k rising from a lower bound until every sample
fits. The result: every micro-batch within the budget, except a sample longer than the budget alone in
its own; and among the others, max cost - min cost <= the longest sample's length (at the time a
sample entered the costliest micro-batch, that one was the cheapest to add to).
Deterministic: ties go to the lower sample index and the lower micro-batch number.
The loss does not depend on the split (training/policy_loss.py divides by the whole step's
denominator), so any partition gives the same step; this module only decides memory and speed.
Left out: balancing across data-parallel ranks (each rank keeps its strided share) and slime's
reordering of micro-batches for pipeline bubbles.
"""

from __future__ import annotations

import heapq
import math
from typing import Optional, Sequence

import torch


def micro_batch_cost(lengths: Sequence[int], padded: bool) -> int:
    """Tokens a micro-batch of samples with these lengths costs: rows × longest when padded, else their sum."""
    if not lengths:
        return 0
    return len(lengths) * max(lengths) if padded else sum(lengths)


def _lpt(order: list[int], lengths: Sequence[int], k: int, max_tokens: int, padded: bool) -> Optional[list[list[int]]]:
    """`order` (longest first) into k micro-batches, each sample where the micro-batch's new cost is least;
    None when a sample fits in none. Heap key: the cost of adding the next (no longer) sample, with its bin number."""
    bins: list[list[int]] = [[] for _ in range(k)]
    cost = [0] * k
    heap = [(0, b) for b in range(k)]  # empty bins first: the k longest samples each open one
    for i in order:
        _, b = heapq.heappop(heap)
        # padded: the bin's longest is its first sample (>= this one), so adding costs one more row of it
        new = max((len(bins[b]) + 1) * (lengths[bins[b][0]] if bins[b] else 0), lengths[i]) if padded else cost[b] + lengths[i]
        if new > max_tokens:  # the cheapest bin to add to: none fits
            return None
        bins[b].append(i)
        cost[b] = new
        key = (len(bins[b]) + 1) * lengths[bins[b][0]] if padded else cost[b]
        heapq.heappush(heap, (key, b))
    return bins


def partition_by_tokens(lengths: Sequence[int], max_tokens: int, padded: bool) -> list[list[int]]:
    """Positions 0..n-1 of `lengths` (tokens per sample) grouped into micro-batches of cost <= max_tokens
    (micro_batch_cost), a sample longer than max_tokens alone; each group in increasing position, groups
    ordered by their first position. Every position exactly once."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    over = [i for i, n in enumerate(lengths) if n > max_tokens]
    fit = sorted((i for i, n in enumerate(lengths) if n <= max_tokens), key=lambda i: (-lengths[i], i))  # longest first
    groups = [[i] for i in over]
    if fit:
        # lower bound on k: the total over the budget, and samples above half the budget never share
        k = max(math.ceil(sum(lengths[i] for i in fit) / max_tokens), sum(2 * lengths[i] > max_tokens for i in fit), 1)
        while (bins := _lpt(fit, lengths, k, max_tokens, padded)) is None:
            k += 1  # terminates: at k = len(fit) every sample opens its own bin
        groups += [sorted(b) for b in bins]
    return sorted(groups, key=lambda g: g[0])


def micro_batch_indices(idx: torch.Tensor, lengths: torch.Tensor, micro_batch_size: Optional[int],
                        max_tokens: Optional[int], padded: bool) -> list[torch.Tensor]:
    """idx [n] rows of a batch -> micro-batches of those rows, each a [m] index tensor.

    lengths [N]: tokens per row of the whole batch (attention_mask.sum(-1)). max_tokens None: consecutive
    chunks of micro_batch_size rows (None: one chunk); else partition_by_tokens over the rows' lengths."""
    if len(idx) == 0:
        return []
    if max_tokens is None:
        size = micro_batch_size or len(idx)
        return [idx[s : s + size] for s in range(0, len(idx), size)]
    groups = partition_by_tokens(lengths[idx].tolist(), max_tokens, padded)
    return [idx[torch.tensor(g, dtype=torch.long)] for g in groups]


def budgets(use_dynamic_batch_size: bool, max_tokens_per_gpu: Optional[int],
            log_probs_max_tokens_per_gpu: Optional[int]) -> tuple[Optional[int], Optional[int]]:
    """(train pass budget, forward-only passes' budget) from train.* keys; (None, None) without dynamic batching."""
    if not use_dynamic_batch_size:
        return None, None
    return max_tokens_per_gpu, max_tokens_per_gpu if log_probs_max_tokens_per_gpu is None else log_probs_max_tokens_per_gpu
