"""`train.qkv_format=thd`: a micro-batch's samples packed into one token stream, no padding (megatron's THD layout).

A right-padded micro-batch (ids/attention [n, T+1], training/batch.py) becomes one row of S = sum(L_i - 1)
tokens: each sample's tokens but its last (which predicts nothing), one after the other; position_ids restart
at 0 per sample, and `cu_seqlens` [n+1] (int32) bounds the samples. Attention stays inside each sample
(block-diagonal causal): transformers builds that mask from the restarting position_ids when no attention
mask is given (masking_utils.find_packed_sequence_indices for sdpa / eager; flash-attention's varlen path
reads the same position_ids); megatron gets PackedSeqParams(qkv_format="thd") from the same cu_seqlens.
Packed token j of sample i (at offset j of it) predicts the sample's token j+1, so per-token outputs come
back to the padded [n, T] layout with `unpack` (0 past each sample's end), where the losses run unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Packed:
    input_ids: Tensor  # [1, S]
    position_ids: Tensor  # [1, S]
    targets: Tensor  # [S]: the token each packed token predicts
    cu_seqlens: Tensor  # [n + 1] int32: sample i is packed tokens cu_seqlens[i]:cu_seqlens[i+1]
    index: Tensor  # [n, T]: the packed token of each (sample, target position); S (the padding slot) past the end
    max_seqlen: int

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[1]


def pack(ids: Tensor, attn: Tensor) -> Packed:
    """ids, attn [n, T+1] right-padded -> the packed stream of every sample's first L_i - 1 tokens."""
    n, t1 = ids.shape
    lengths = (attn.sum(-1) - 1).clamp(min=0).cpu()  # [n] tokens each sample puts in the stream
    keep = torch.arange(t1 - 1)[None] < lengths[:, None]  # [n, T]
    cu = torch.zeros(n + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    s = int(cu[-1])
    pos = torch.arange(t1 - 1).expand(n, -1)  # [n, T]
    index = torch.where(keep, cu[:-1, None].long() + pos, s)  # [n, T]
    keep_d = keep.to(ids.device)
    return Packed(input_ids=ids[:, :-1][keep_d][None], position_ids=pos.to(ids.device)[keep_d][None],
                  targets=ids[:, 1:][keep_d], cu_seqlens=cu.to(ids.device), index=index.to(ids.device),
                  max_seqlen=int(lengths.max()) if n else 0)


def unpack(x: Tensor, p: Packed) -> Tensor:
    """x [S, ...] per packed token -> [n, T, ...] in the padded layout, zeros past each sample's end."""
    padded = torch.cat([x, x.new_zeros(1, *x.shape[1:])])  # [S + 1, ...]: row S is the padding slot
    return padded[p.index]
