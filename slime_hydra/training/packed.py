"""Training logits over packed tokens (`model.model_impl=native`): no padding, each prompt once.

The same contract as `prefix.shared_prefix_logits`: [n, T, V] logits equal to
`model(ids, attn).logits[:, :-1]` wherever the loss mask is on (0 elsewhere), with autograd to the
model's parameters. The tokens that run are each distinct prefix once (with `share_prefix`: a row's
tokens up to its first trained position, i.e. the GRPO group's prompt) and each row's remaining
input tokens; no padding token passes a linear layer. Without `share_prefix` every row is its own
prefix (still padding-free). Rows that share a prefix by token identity only: multi-turn rows whose
trained tokens start elsewhere stay exact.
Shapes: ids/attention [n, T+1] right-padded (training/batch.py), loss mask [n, T].
"""

from __future__ import annotations

import torch
from torch import Tensor

from slime_hydra.models.native import lm_head, native_weights, packed_forward, segment_attention, segments
from slime_hydra.training.prefix import split_points


def packed_logits(model, ids: Tensor, attn: Tensor, loss_mask: Tensor, share_prefix: bool = True) -> Tensor:
    n, t1 = ids.shape
    rows, lengths = ids.tolist(), attn.sum(-1).tolist()
    # a row's prefix ends at its first trained position (share_prefix) or at its last input token
    ends = split_points(loss_mask).tolist() if share_prefix else [max(length - 2, 0) for length in lengths]
    tokens: list[int] = []
    positions: list[int] = []
    spans: list[tuple[int, int, int, int]] = []  # per segment: query start, query length, prefix start, prefix length
    prefix_start: dict[tuple[int, ...], int] = {}
    row_prefix: list[tuple[int, int]] = []  # (start, length) of each row's prefix in the packed tokens
    for row, end in zip(rows, ends):
        key = tuple(row[: end + 1])
        if key not in prefix_start:
            prefix_start[key] = len(tokens)
            spans.append((len(tokens), len(key), 0, 0))
            tokens += key
            positions += range(len(key))
        row_prefix.append((prefix_start[key], len(key)))
    suffix_start = []
    for row, end, length, (p0, plen) in zip(rows, ends, lengths, row_prefix):
        suffix = row[end + 1 : length - 1]  # the last token predicts nothing
        suffix_start.append(len(tokens))
        if suffix:
            spans.append((len(tokens), len(suffix), p0, plen))
            tokens += suffix
            positions += range(end + 1, end + 1 + len(suffix))
    q_start, q_len, k_start, k_len = torch.tensor(spans).unbind(1)
    pos = torch.tensor(positions)
    seg = segments(q_start, q_len, k_start, k_len, pos, ids.device)
    # [n, T] packed token whose logits predict each trained target (N, the padding slot, elsewhere)
    t = torch.arange(t1 - 1)[None]  # [1, T]  (index arithmetic on the CPU, then one copy to the device)
    end = torch.tensor(ends)[:, None]  # [n, 1]
    in_prefix = torch.tensor([p0 for p0, _ in row_prefix])[:, None] + t
    in_suffix = torch.tensor(suffix_start)[:, None] + t - end - 1
    index = torch.where(loss_mask.cpu() > 0, torch.where(t <= end, in_prefix, in_suffix), len(tokens))  # [n, T]
    # the M tokens whose logits are read; index renumbered into them (M: the padding slot)
    read = torch.zeros(len(tokens) + 1, dtype=torch.bool).index_fill_(0, index.flatten(), True)[:-1]  # [N]
    out = read.nonzero().flatten()  # [M]
    renumber = torch.full((len(tokens) + 1,), len(out), dtype=torch.long).index_copy_(0, out, torch.arange(len(out)))
    weights = native_weights(model)
    hidden = packed_forward(weights, torch.tensor(tokens, device=ids.device), pos.to(ids.device),
                            attend=lambda _layer, q, k, v: segment_attention(q, k, v, seg), out=out.to(ids.device))
    logits = pad_row(lm_head(weights, hidden))  # [M + 1, V]
    return logits.index_select(0, renumber[index].flatten().to(ids.device)).view(n, t1 - 1, -1)  # [n, T, V]


def pad_row(x: Tensor) -> Tensor:
    """x with one zero row appended: the padding slot's value (index M of M tokens)."""
    return torch.cat([x, x.new_zeros(1, *x.shape[1:])])
