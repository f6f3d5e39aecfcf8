"""A rank's samples -> micro-batches: `micro_batch_size` samples each, or by a token budget (slime's
`--use-dynamic-batch-size --max-tokens-per-gpu`).

The budget bounds a micro-batch's cost: its padded tokens (rows × longest row) where the forward pads
to the longest sample (transformers, megatron), its real tokens where it packs (model.model_impl=native).
Samples go longest first, and a sample longer than the budget trains alone. Then, by cost:
- padded: consecutive runs of the length-sorted samples (a long sample with short ones pays their padding),
  the fewest runs the budget allows, cut so that the costliest run is as cheap as any that many runs allow
  (on small cases this is the optimum over every partition: tests/training/test_microbatch.py brute-forces it);
- packed: balanced LPT, each sample into the micro-batch with the fewest tokens among k, k rising from a
  lower bound until every sample fits; then max cost - min cost <= the longest sample (when a sample
  entered the costliest micro-batch, that one had the fewest tokens).
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


def _lpt(order: list[int], lengths: Sequence[int], k: int, max_tokens: int) -> Optional[list[list[int]]]:
    """Packed cost: `order` (longest first) into k micro-batches, each sample into the one with the fewest tokens
    (ties: the lower number); None when it does not fit there (then it fits nowhere)."""
    bins: list[list[int]] = [[] for _ in range(k)]
    heap = [(0, b) for b in range(k)]  # (tokens, bin): the k longest samples open a bin each
    for i in order:
        cost, b = heapq.heappop(heap)
        if cost + lengths[i] > max_tokens:
            return None
        bins[b].append(i)
        heapq.heappush(heap, (cost + lengths[i], b))
    return bins


def _runs(order: list[int], lengths: Sequence[int], cap: int) -> list[list[int]]:
    """`order` (longest first) cut into consecutive runs, each as long as rows × its first (longest) <= cap."""
    runs: list[list[int]] = []
    for i in order:
        if runs and (len(runs[-1]) + 1) * lengths[runs[-1][0]] <= cap:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def _balanced_runs(order: list[int], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Padded cost: the fewest runs the budget allows (greedy runs are the fewest), then the lowest cap that still
    gives that many (binary search; the run count falls as the cap rises), so the costliest run is as cheap as can be."""
    k = len(_runs(order, lengths, max_tokens))
    lo, hi = lengths[order[0]], max_tokens
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_runs(order, lengths, mid)) <= k:
            hi = mid
        else:
            lo = mid + 1
    return _runs(order, lengths, lo)


def partition_by_tokens(lengths: Sequence[int], max_tokens: int, padded: bool) -> list[list[int]]:
    """Positions 0..n-1 of `lengths` (tokens per sample) grouped into micro-batches of cost <= max_tokens
    (micro_batch_cost), a sample longer than max_tokens alone; each group in increasing position, groups
    ordered by their first position. Every position exactly once."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    over = [i for i, n in enumerate(lengths) if n > max_tokens]
    fit = sorted((i for i, n in enumerate(lengths) if n <= max_tokens), key=lambda i: (-lengths[i], i))  # longest first
    groups = [[i] for i in over]
    if fit and padded:
        groups += _balanced_runs(fit, lengths, max_tokens)
    elif fit:
        # lower bound on k: the total over the budget, and samples above half the budget never share
        k = max(math.ceil(sum(lengths[i] for i in fit) / max_tokens), sum(2 * lengths[i] > max_tokens for i in fit), 1)
        while (bins := _lpt(fit, lengths, k, max_tokens)) is None:
            k += 1  # terminates: at k = len(fit) every sample opens its own bin
        groups += bins
    return sorted((sorted(g) for g in groups), key=lambda g: g[0])


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
