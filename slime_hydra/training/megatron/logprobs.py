"""Per-token log-probs and entropy from vocab-parallel logits, chunked, without full fp32 logits.

Each TP rank holds logits[..., V_pad/tp] in the model dtype. One autograd Function computes, per
chunk of `chunk_size` tokens (train.megatron.log_probs_chunk_size, slime's name; -1: one chunk),
this rank's softmax statistics in fp32 (max m, sum of exp, target logit, sum of exp * z), combines
them over the TP group in one step (online-softmax rescaling by exp(m - M)), and keeps only the
log-sum-exp and E_p[z] per token for the backward pass, which is written by hand:
  d log p(t) / d z_j = [j == t] - p_j,     d H / d z_j = -p_j (z_j - E_p[z]),
so the backward pass recomputes p from the logits chunk by chunk and writes the logits' gradient in
their own dtype: no [tokens, V] fp32 tensor outlives a chunk, and no autograd graph of the fp32 ops
is kept or re-run. With `compiled` (train.megatron.compile_log_probs, CUDA) both per-chunk kernels
go through torch.compile: each is then one fused pass over the bf16 chunk instead of ~10 eager fp32
passes. The backward pass needs no communication (the statistics are already global).
Vocabulary rows past the true vocab (padding to a multiple of TP) are masked out, so the result
equals log_softmax over the real vocabulary (what transformers and the torch backend compute).
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from torch import Tensor


def _masked_z(logits: Tensor, temperature: float, start: int, vocab: int) -> tuple[Tensor, Tensor]:
    z = logits.float() / temperature  # [n, Vl]
    valid = torch.arange(start, start + z.shape[-1], device=z.device) < vocab  # [Vl]
    return torch.where(valid, z, torch.finfo(z.dtype).min), valid


def _local_stats(logits: Tensor, targets: Tensor, temperature: float, start: int, vocab: int) -> Tensor:
    """[n, Vl] logits, [n] targets -> [4, n] fp32: max, sum exp(z - max), target z (0 off this rank), sum exp(z - max) z."""
    z, valid = _masked_z(logits, temperature, start, vocab)
    m = z.max(-1).values  # [n]
    e = torch.exp(z - m.unsqueeze(-1)) * valid  # [n, Vl]
    local = (targets >= start) & (targets < start + z.shape[-1])
    idx = (targets - start).clamp(0, z.shape[-1] - 1)
    tgt = torch.where(local, z.gather(-1, idx.unsqueeze(-1)).squeeze(-1), 0.0)
    sz = (e * torch.where(valid, z, 0.0)).sum(-1)
    return torch.stack([m, e.sum(-1), tgt, sz])


def _grad(logits: Tensor, targets: Tensor, lse: Tensor, ez: Tensor, g_lp: Tensor, g_ent: Tensor,
          temperature: float, start: int, vocab: int) -> Tensor:
    """d(sum g_lp * logp + g_ent * H) / d logits for one chunk, in the logits' dtype."""
    z, valid = _masked_z(logits, temperature, start, vocab)
    p = torch.exp(z - lse.unsqueeze(-1))  # [n, Vl]; 0 on padding columns
    # where, not * valid: on padding columns z is finfo.min, and g_ent * (z - E_p[z]) can overflow to inf (0 * inf = nan)
    g = torch.where(valid, -p * (g_lp.unsqueeze(-1) + g_ent.unsqueeze(-1) * (z - ez.unsqueeze(-1))), 0.0)
    cols = torch.arange(start, start + z.shape[-1], device=z.device)
    g = g + torch.where(cols == targets.unsqueeze(-1), g_lp.unsqueeze(-1), 0.0)
    return (g / temperature).to(logits.dtype)


@functools.cache
def _kernels(compiled: bool):
    if not compiled:
        return _local_stats, _grad
    # dynamic=None: the first shape (a full chunk) compiles static, the next (a last, shorter chunk: RL sequence
    # lengths vary) compiles once with a dynamic token dimension; dynamic=False recompiled per length and hit
    # dynamo's recompile limit (then eager) in an H200 GRPO run
    return torch.compile(_local_stats, dynamic=None), torch.compile(_grad, dynamic=None)


def _global_stats(local: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[4, n] per-rank stats -> (target z, lse, E_p[z]) over the whole vocabulary (all TP ranks)."""
    m, se, tgt, sz = local
    if ps.get_tensor_model_parallel_world_size() > 1:
        group = ps.get_tensor_model_parallel_group()
        big_m = m.clone()
        dist.all_reduce(big_m, op=dist.ReduceOp.MAX, group=group)
        scale = torch.exp(m - big_m)  # a rank whose max is lower rescales its sums
        sums = torch.stack([se * scale, tgt, sz * scale])
        dist.all_reduce(sums, group=group)
        (se, tgt, sz), m = sums, big_m
    return tgt, m + torch.log(se), sz / se


class _LogProbEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, start, vocab, chunk, compiled):  # [N, Vl], [N]
        stats, grad = _kernels(compiled)
        parts = [stats(logits[i : i + chunk], targets[i : i + chunk], temperature, start, vocab)
                 for i in range(0, logits.shape[0], chunk)]
        tgt, lse, ez = _global_stats(torch.cat(parts, dim=1))  # [N] each
        ctx.save_for_backward(logits, targets, lse, ez)
        ctx.args = (temperature, start, vocab, chunk, compiled)
        return tgt - lse, lse - ez  # log p(target), entropy

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        logits, targets, lse, ez = ctx.saved_tensors
        temperature, start, vocab, chunk, compiled = ctx.args
        grad = _kernels(compiled)[1]
        out = torch.empty_like(logits)
        for i in range(0, logits.shape[0], chunk):
            s = slice(i, i + chunk)
            out[s] = grad(logits[s], targets[s], lse[s], ez[s], g_lp[s], g_ent[s], temperature, start, vocab)
        return out, None, None, None, None, None, None


def vocab_parallel_logprobs(logits: Tensor, targets: Tensor, vocab: int, temperature: float = 1.0,
                            with_entropy: bool = True, chunk_size: int = 1024,
                            compiled: bool = False) -> tuple[Tensor, Tensor]:
    """logits [b, s, V_pad/tp] (this rank's vocab shard), targets [b, s] -> (log-probs [b, s], entropy [b, s]) fp32."""
    b, s, vl = logits.shape
    start = ps.get_tensor_model_parallel_rank() * vl
    n = b * s if chunk_size == -1 else chunk_size
    lp, ent = _LogProbEntropy.apply(logits.reshape(b * s, vl), targets.reshape(b * s), temperature, start, vocab, n,
                                    compiled)
    return lp.view(b, s), (ent if with_entropy else ent.detach()).view(b, s)
