"""Per-token log-probs and entropy from vocab-parallel logits, chunked, without full fp32 logits.

Each TP rank holds logits[..., V_pad/tp] in the model dtype. Per chunk of `chunk_size` tokens
(train.megatron.log_probs_chunk_size, slime's name; -1: all tokens in one chunk) the fp32
softmax statistics are reduced over the TP group (max, sum of exp, target logit, sum p*z);
each chunk runs under activation checkpointing, so the backward pass recomputes its fp32 work
instead of keeping [tokens, V] fp32 tensors alive: peak extra memory is one chunk.
Vocabulary rows past the true vocab (padding to a multiple of TP) are masked out, so the result
equals log_softmax over the real vocabulary (what transformers and the torch backend compute).
Reductions use megatron's reduce_from_tensor_model_parallel_region (all-reduce forward,
identity backward): every TP rank computes the same replicated loss.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state as ps
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region as tp_sum
from torch import Tensor

def _chunk(logits: Tensor, targets: Tensor, temperature: float, start: int, vocab: int) -> tuple[Tensor, Tensor]:
    z = logits.float() / temperature  # [n, Vl]
    cols = torch.arange(start, start + z.shape[-1], device=z.device)
    valid = cols < vocab  # [Vl]
    z = torch.where(valid, z, torch.finfo(z.dtype).min)
    m = z.detach().max(-1, keepdim=True).values  # [n, 1] a constant shift: no gradient needed
    if ps.get_tensor_model_parallel_world_size() > 1:
        torch.distributed.all_reduce(m, op=torch.distributed.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    e = torch.exp(z - m) * valid  # [n, Vl]
    se = tp_sum(e.sum(-1))  # [n]
    local = (targets >= start) & (targets < start + z.shape[-1])  # [n]
    idx = (targets - start).clamp(0, z.shape[-1] - 1)
    tgt = tp_sum(torch.where(local, z.gather(-1, idx.unsqueeze(-1)).squeeze(-1), 0.0))  # [n]
    lse = m.squeeze(-1) + torch.log(se)  # [n]
    pz = tp_sum((e * torch.where(valid, z, 0.0)).sum(-1)) / se  # [n] E_p[z]
    return tgt - lse, lse - pz  # log p(target), entropy


def vocab_parallel_logprobs(logits: Tensor, targets: Tensor, vocab: int, temperature: float = 1.0,
                            with_entropy: bool = True, chunk_size: int = 1024) -> tuple[Tensor, Tensor]:
    """logits [b, s, V_pad/tp] (this rank's vocab shard), targets [b, s] -> (log-probs [b, s], entropy [b, s]) fp32."""
    b, s, vl = logits.shape
    start = ps.get_tensor_model_parallel_rank() * vl
    flat, tflat = logits.reshape(b * s, vl), targets.reshape(b * s)
    n = b * s if chunk_size == -1 else chunk_size
    lps, ents = [], []
    for i in range(0, b * s, n):
        args = (flat[i : i + n], tflat[i : i + n], temperature, start, vocab)
        if torch.is_grad_enabled() and logits.requires_grad:
            lp, ent = torch.utils.checkpoint.checkpoint(_chunk, *args, use_reentrant=False)
        else:
            lp, ent = _chunk(*args)
        lps.append(lp)
        ents.append(ent if with_entropy else ent.detach())
    return torch.cat(lps).view(b, s), torch.cat(ents).view(b, s)
