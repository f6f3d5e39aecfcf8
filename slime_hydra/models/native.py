"""`model.model_impl=native`: the project's own forward of the dense Qwen3 / Llama block over a
transformers model's parameters, for packed (padding-free) batches.

The transformers module still owns the weights (optimizer, `save_pretrained`, `from_pretrained`, weight
sync); only the forward differs. What it buys: every linear layer, norm and activation runs on the
batch's real tokens alone, packed into one [N, d] matrix, and only attention sees a padded view. A GRPO
step's rows are short and ragged (the embedded task: ~7 prompt tokens, 1-6 response tokens), so a
padded [n, T] batch spends ~40% of its FLOPs on padding; the rollout's finished rows stop costing
anything too (see `PackedDecoder`).

The attention layout is a list of "segments": each segment is a run of query tokens and the keys they
attend to (its own earlier tokens, plus an optional shared prefix), causal by absolute position.
Training (`packed_logits`) uses one segment per distinct prompt prefix and one per row's suffix after
it, so a GRPO group's prompt is computed once and its keys are shared by every row of the group.

Left out: sliding windows, rope scaling, attention/MLP biases, tensor parallelism, MoE (transformers'
path or the megatron backend has those; validation's `check_model_impl` refuses such a model here).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Segments:
    """Attention layout over N packed tokens: S segments, each Lq query slots and Lk key slots. A padding
    slot indexes token 0: a padding query's output is never read and a padding key is masked out, so any
    real token serves (no padding row is appended to q, k or v)."""

    q_index: Tensor  # [S, Lq] packed token of each query slot
    k_index: Tensor  # [S, Lk] packed token of each key slot
    allowed: Tensor  # [S, 1, Lq, Lk] bool: the key is real and not after the query
    slot_of_token: Tensor  # [N] flat index into [S * Lq] where each token is a query


def segments(q_start: Tensor, q_len: Tensor, k_start: Tensor, k_len: Tensor, positions: Tensor, device) -> Segments:
    """Segment s: its queries are the packed tokens q_start[s] .. q_start[s] + q_len[s] - 1, its keys the tokens
    k_start[s] .. k_start[s] + k_len[s] - 1 (a shared prefix; k_len 0: none) followed by its queries. positions
    [N]: each token's absolute position, so "not after" is position order across a shared prefix and its
    suffix. All [S] / [N] CPU tensors: the layout is built with tensor ops (nested Python lists through
    torch.tensor cost ~1 us per element: ~2.4 ms for a training step's ~220 segments)."""
    n = len(positions)
    lq, lk = int(q_len.max()), int((k_len + q_len).max())
    j = torch.arange(lq)[None]  # [1, Lq]
    qi = torch.where(j < q_len[:, None], q_start[:, None] + j, n)  # [S, Lq] (n: padding)
    j = torch.arange(lk)[None]  # [1, Lk]
    own = j - k_len[:, None]  # [S, Lk] index into the segment's own queries
    ki = torch.where(j < k_len[:, None], k_start[:, None] + j, torch.where(own < q_len[:, None], q_start[:, None] + own, n))
    pos = torch.cat([positions, positions.new_full((1,), 1 << 30)])  # [N + 1]: a padding slot comes after every token
    # a padding query attends to every real key of its segment (never to none: softmax of all -inf is NaN)
    allowed = (pos[ki][:, None, :] <= pos[qi][:, :, None]) & (ki < n)[:, None, :]  # [S, Lq, Lk]
    flat = qi.flatten()
    real = flat < n
    slot = torch.empty(n, dtype=torch.long)
    slot[flat[real]] = torch.arange(len(flat))[real]
    return Segments(qi.masked_fill(qi == n, 0).to(device), ki.masked_fill(ki == n, 0).to(device),
                    allowed[:, None].to(device), slot.to(device))


@functools.lru_cache(maxsize=8)
def _rope_table(theta: float, d: int, length: int, device: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """[length, D] cos and sin, computed as transformers' default rope does (float32, then cast)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float, device=device) / d))
    freqs = torch.arange(length, dtype=torch.float, device=device)[:, None] * inv_freq  # [length, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # (chunk's backward is one cat; two slices' would be two zero-filled copies)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last dim; weight [D], or [H, D] over x [N, H, D] (qwen3's q/k norms stacked per head).
    (A hand-written backward was tried: 530 us per norm of the embedded default's training step against
    autograd's ~680 over the composite, no faster per step in an interleaved A/B; not kept.)"""
    if weight.dim() == 1:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return F.rms_norm(x, (x.shape[-1],), None, eps) * weight


def short_softmax(x: Tensor) -> Tensor:
    """softmax over a short last dim (a segment's ~5-15 keys). torch's softmax kernel costs ~10 ns per element
    at that width on CPU (100 us for 10k elements, 2 threads), these five elementwise ops about a third of it.
    The max is detached: softmax is shift-invariant, so that is exact and spares autograd the max's backward.
    Every row has at least one finite entry (segments never leave a query without keys)."""
    e = (x - x.amax(-1, keepdim=True).detach()).exp()
    return e / e.sum(-1, keepdim=True)


def segment_attention(q: Tensor, k: Tensor, v: Tensor, seg: Segments) -> Tensor:
    """q [N, H, D], k/v [N, Hkv, D] -> [N, H, D]. Gathers with index_select (its backward is index_add, far
    cheaper on CPU than advanced indexing's index_put)."""
    n, h, d = q.shape
    s, lq = seg.q_index.shape
    hkv, lk = k.shape[1], seg.k_index.shape[1]
    g = h // hkv
    qp = q.index_select(0, seg.q_index.flatten())  # [S*Lq, H, D]
    qp = qp.view(s, lq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(s, hkv, g * lq, d)  # query head = kv head * g + j
    kp = k.index_select(0, seg.k_index.flatten()).view(s, lk, hkv, d).permute(0, 2, 3, 1)  # [S, Hkv, D, Lk]
    vp = v.index_select(0, seg.k_index.flatten()).view(s, lk, hkv, d).transpose(1, 2)  # [S, Hkv, Lk, D]
    scores = (qp @ kp).view(s, hkv, g, lq, lk) * d**-0.5
    scores = scores.masked_fill(~seg.allowed[:, None], float("-inf"))  # [S, Hkv, G, Lq, Lk]
    o = short_softmax(scores).view(s, hkv, g * lq, lk) @ vp  # [S, Hkv, G*Lq, D]
    o = o.view(s, hkv, g, lq, d).permute(0, 3, 1, 2, 4).reshape(s * lq, h, d)
    return o.index_select(0, seg.slot_of_token)  # [N, H, D]


class LayerWeights(NamedTuple):
    input_norm: Tensor  # [d]
    qkv_t: Tensor  # [d, (H + 2 Hkv) D]: q, k, v stacked (one GEMM), transposed
    qk_norm: Optional[Tensor]  # [H + Hkv, D] qwen3's q and k norm weights per head (one norm over both); None for llama
    o_t: Tensor  # [H D, d]
    post_norm: Tensor  # [d]
    gate_up_t: Tensor  # [d, 2 F]: gate and up stacked (one GEMM)
    down_t: Tensor  # [F, d]


@dataclass(frozen=True)
class NativeWeights:
    """Everything the forward reads, gathered once: built per forward in training (autograd reaches the
    parameters through the cats), once per generate call in decoding. Spares each layer of each decode step
    its module and config attribute look-ups."""

    embed: Tensor  # [V, d]
    layers: list[LayerWeights]
    norm: Tensor  # [d]
    head_t: Tensor  # [d, V]
    heads: int  # H
    kv_heads: int  # Hkv
    head_dim: int  # D
    eps: float
    cos: Tensor  # [max_position_embeddings, D]
    sin: Tensor


def native_weights(model) -> NativeWeights:
    c, body = model.config, model.model
    h, hkv = c.num_attention_heads, c.num_key_value_heads
    d = getattr(c, "head_dim", None) or c.hidden_size // h
    layers = []
    for layer in body.layers:
        a, m = layer.self_attn, layer.mlp
        qk_norm = torch.cat([a.q_norm.weight.expand(h, -1), a.k_norm.weight.expand(hkv, -1)]) if hasattr(a, "q_norm") else None
        layers.append(LayerWeights(layer.input_layernorm.weight, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).t(),
                                   qk_norm, a.o_proj.weight.t(), layer.post_attention_layernorm.weight,
                                   torch.cat([m.gate_proj.weight, m.up_proj.weight]).t(), m.down_proj.weight.t()))
    cos, sin = _rope_table(float(c.rope_parameters["rope_theta"]), d, c.max_position_embeddings,
                           str(body.embed_tokens.weight.device), body.embed_tokens.weight.dtype)
    return NativeWeights(body.embed_tokens.weight, layers, body.norm.weight, model.lm_head.weight.t(), h, hkv, d,
                         c.rms_norm_eps, cos, sin)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """One query per row: q [A, H, D], k/v [A, Hkv, K, D], bias [A, 1, 1, K] (0 or -inf) -> [A, H, D]. Plain
    batched matmuls (for a single query, cheaper on CPU than SDPA's flash kernel)."""
    a, h, d = q.shape
    hkv = k.shape[1]
    scores = (q * d**-0.5).view(a, hkv, h // hkv, d) @ k.transpose(-1, -2) + bias  # [A, Hkv, G, K]
    return (short_softmax(scores) @ v).reshape(a, h, d)  # [A, Hkv, G, D] -> [A, H, D]


def project_qkv(w: NativeWeights, layer: LayerWeights, h: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """h [N, d] -> q [N, H, D], k and v [N, Hkv, D]: q and k normed per head (qwen3) and rotated together."""
    qk, v = (h @ layer.qkv_t).view(-1, w.heads + 2 * w.kv_heads, w.head_dim).split([w.heads + w.kv_heads, w.kv_heads], 1)
    if layer.qk_norm is not None:
        qk = rms_norm(qk, layer.qk_norm, w.eps)  # [N, H + Hkv, D]
    q, k = rotate(qk, cos, sin).split([w.heads, w.kv_heads], 1)
    return q, k, v


def mlp(layer: LayerWeights, h: Tensor) -> Tensor:
    gate, up = (h @ layer.gate_up_t).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ layer.down_t


def packed_forward(w: NativeWeights, ids: Tensor, positions: Tensor, attend, out: Optional[Tensor] = None) -> Tensor:
    """ids/positions [N] -> final hidden states [N, d], or [M, d] of the tokens `out` [M] only. attend(layer, q, k, v)
    -> [N, H, D] is the attention of one layer over the packed tokens (it decides who sees whom).
    With `out`, the last layer's output projection and MLP run on those tokens alone: every token's keys and
    values are still made there, but a token whose hidden state nobody reads (a prompt token before the last,
    in training and prefill) needs no more (the embedded default: ~190 of ~900 training tokens, 192 of 224
    prefill tokens)."""
    x = F.embedding(ids, w.embed)  # [N, d]
    cos, sin = w.cos[positions][:, None], w.sin[positions][:, None]  # [N, 1, D]
    last = len(w.layers) - 1
    for i, layer in enumerate(w.layers):
        q, k, v = project_qkv(w, layer, rms_norm(x, layer.input_norm, w.eps), cos, sin)
        o = attend(i, q, k, v).reshape(len(ids), -1)  # [N, H*D]
        if i == last and out is not None:
            x, o = x.index_select(0, out), o.index_select(0, out)  # [M, d], [M, H*D]
        x = x + o @ layer.o_t
        x = x + mlp(layer, rms_norm(x, layer.post_norm, w.eps))
    return rms_norm(x, w.norm, w.eps)


def lm_head(weights: NativeWeights, hidden: Tensor) -> Tensor:
    return hidden @ weights.head_t  # [N, V]
