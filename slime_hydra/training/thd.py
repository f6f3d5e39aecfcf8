"""`train.qkv_format=thd`: a micro-batch's samples packed into one token stream, no padding (megatron's THD layout).

A right-padded micro-batch (ids/attention [n, T+1], training/batch.py) becomes one row of S = sum(L_i - 1)
tokens: each sample's tokens but its last (which predicts nothing), one after the other; position_ids restart
at 0 per sample, and `cu_seqlens` [n+1] (int32) bounds the samples. Attention stays inside each sample
(block-diagonal causal). For a transformers model `thd_logits` runs the model's attention layers through
`thd_attention` (causal within each sample of cu_seqlens, no [S, S] mask anywhere), whatever
model.attn_implementation says. (transformers would also build that mask
itself from the restarting position ids, masking_utils.find_packed_sequence_indices, when given no attention
mask and no KV cache; but as a dense [S, S] mask, which sdpa then computes in full: quadratic in the packed
length, slower than padding on the CPU bench; tests/training/test_packing.py checks both agree.) megatron gets
PackedSeqParams(qkv_format="thd") from the same cu_seqlens (training/megatron/model.py). Both attentions run
`causal_varlen_attention` where torch's varlen kernel takes the inputs (CUDA, fp16/bf16: one flash launch for the
whole stream, no host sync) and `causal_loop_attention` (one SDPA call per sample) elsewhere.
Packed token j of sample i (at offset j of it) predicts the sample's token j+1, so per-token outputs come
back to the padded [n, T] layout with `unpack` (0 past each sample's end), where the losses run unchanged.
"""

from __future__ import annotations

import inspect
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

THD_ATTENTION = "slime_hydra_thd"  # the name thd_attention is registered under in transformers' attention functions


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


def thd_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, dropout: float = 0.0,
                  scaling=None, cu_seq_lens_q: Tensor = None, **kwargs) -> tuple[Tensor, None]:
    """A transformers attention function: query [1, heads, S, dim], key/value [1, kv_heads, S, dim] of packed samples
    -> ([1, S, heads, dim], None), causal attention within each sample of cu_seq_lens_q."""
    if cu_seq_lens_q is None:
        raise ValueError("thd_attention runs packed micro-batches only (training/thd.py thd_logits)")
    unsupported = [k for k in ("sliding_window", "softcap", "s_aux") if kwargs.get(k) is not None]
    if unsupported:  # plain causal attention only: say so rather than drop a model's attention variant
        raise NotImplementedError(f"train.qkv_format=thd: the packed attention has no {unsupported}; use train.qkv_format=bshd")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [S, heads, dim]
    max_seqlen = kwargs.get("max_length_q")
    if varlen_usable(q, scaling, dropout, max_seqlen):  # the GPU: one flash launch, as megatron's SDPAttention._thd
        out = causal_varlen_attention(q, k, v, cu_seq_lens_q, max_seqlen, scaling)
    else:
        out = causal_loop_attention(q, k, v, cu_seq_lens_q, scaling, dropout)
    return out[None].contiguous(), None  # [1, S, heads, dim]


@dataclass(frozen=True)
class Varlen:
    """torch.nn.attention.varlen.varlen_attn and how this torch's version of it is called (its signature changed:
    torch 2.9/2.10 take is_causal and no scale; later ones window_size=(-1, 0) for causal and scale; enable_gqa later)."""

    fn: Callable
    causal: dict  # {"is_causal": True} or {"window_size": (-1, 0)} (a tuple: the function compares it to one)
    takes_scale: bool
    takes_gqa: bool  # enable_gqa=; without it k/v heads are repeated to the query heads


def find_varlen() -> Optional[Varlen]:
    """This torch's varlen_attn, or None where it lacks one or a way to ask for causal attention."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        causal = {"is_causal": True}
    elif "window_size" in params:
        causal = {"window_size": (-1, 0)}
    else:
        return None
    return Varlen(varlen_attn, causal, "scale" in params, "enable_gqa" in params)


VARLEN = find_varlen()  # once at import: the attention below runs inside torch.compile'd layers


def varlen_usable(query: Tensor, scale: Optional[float], dropout: float, max_seqlen: Optional[int]) -> bool:
    """Whether causal_varlen_attention can run these [t, heads, dim] queries: a CUDA flash kernel (fp16/bf16, head
    dim a multiple of 8 up to 256), no dropout, the default softmax scale unless this torch's varlen_attn takes one."""
    dim = query.shape[-1]
    return (VARLEN is not None and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16) and dropout == 0.0
            and max_seqlen is not None and dim % 8 == 0 and dim <= 256
            and (VARLEN.takes_scale or scale is None or math.isclose(scale, dim ** -0.5)))


def causal_varlen_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                            scale: Optional[float] = None) -> Tensor:
    """q [t, heads, dim], k/v [t, kv_heads, dim] of packed samples -> [t, heads, dim], causal within each sample of
    cu_seqlens [n+1]: torch's varlen flash kernel, one launch (check varlen_usable first)."""
    kw = dict(VARLEN.causal)
    if VARLEN.takes_scale:
        kw["scale"] = scale
    if k.shape[1] != q.shape[1]:
        if VARLEN.takes_gqa:
            kw["enable_gqa"] = True
        else:
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    # megatron hands views of its fused qkv projection: the flash kernel is given dense tensors (a copy of k/v at most)
    q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
    cu = cu_seqlens.to(torch.int32)
    return VARLEN.fn(q, k, v, cu, cu, max_seqlen, max_seqlen, **kw)


def causal_loop_attention(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, scale: Optional[float] = None,
                          dropout: float = 0.0) -> Tensor:
    """The same as causal_varlen_attention on any device and dtype: one causal SDPA call per sample (flash on the GPU,
    the math kernel on CPU; no [t, t] mask), after a host read of cu_seqlens."""
    bounds = cu_seqlens.tolist()
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [heads, t, dim]
    out = torch.cat([F.scaled_dot_product_attention(q[None, :, a:b], k[None, :, a:b], v[None, :, a:b], is_causal=True,
                                                    scale=scale, dropout_p=dropout, enable_gqa=q.shape[0] != k.shape[0])[0]
                     for a, b in zip(bounds[:-1], bounds[1:]) if b > a], dim=1)  # [heads, t, dim]
    return out.transpose(0, 1)


@contextmanager
def _attention(model: torch.nn.Module, name: str) -> Iterator[None]:
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = name  # read by every attention layer at each forward
    try:
        yield
    finally:
        config._attn_implementation = before


def thd_logits(model: torch.nn.Module, p: Packed) -> Tensor:
    """[S, V] logits of a transformers causal LM over the packed stream, each sample attending to itself only."""
    return thd_forward(model, p).logits[0]


def thd_forward(model: torch.nn.Module, p: Packed):
    """A transformers model (causal LM or its decoder body) over the packed stream: its output, batch of 1.

    The attention mask is given as transformers' per-layer-type mapping of None (no [S, S] mask is built) and no KV
    cache is made; cu_seq_lens_q reaches thd_attention through the model's attention kwargs."""
    from transformers import AttentionInterface  # here, as elsewhere in the package: transformers is slow to import

    AttentionInterface.register(THD_ATTENTION, thd_attention)  # idempotent: a name of our own in the global registry
    with _attention(model, THD_ATTENTION):
        return model(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=False,
                     attention_mask={"full_attention": None, "sliding_attention": None},
                     cu_seq_lens_q=p.cu_seqlens, cu_seq_lens_k=p.cu_seqlens, max_length_q=p.max_seqlen,
                     max_length_k=p.max_seqlen)
