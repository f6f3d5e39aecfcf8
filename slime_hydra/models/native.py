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
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

@dataclass(frozen=True)
class Segments:
    """Attention layout over N packed tokens: S segments, each Lq query slots and Lk key slots.
    Index N (one past the last token) is the padding slot."""

    q_index: Tensor  # [S, Lq] packed token of each query slot
    k_index: Tensor  # [S, Lk] packed token of each key slot
    allowed: Tensor  # [S, 1, Lq, Lk] bool: the key is real and not after the query
    slot_of_token: Tensor  # [N] flat index into [S * Lq] where each token is a query


def segments(queries: list[list[int]], keys: list[list[int]], positions: list[int], device) -> Segments:
    """queries[s] / keys[s]: packed token indices (keys include the queries); positions: each token's
    absolute position, so "not after" is position order across a shared prefix and its suffix."""
    n = len(positions)
    lq, lk = max(len(q) for q in queries), max(len(k) for k in keys)
    pos = positions + [-1]
    qi = [q + [n] * (lq - len(q)) for q in queries]
    ki = [k + [n] * (lk - len(k)) for k in keys]
    # a padding query attends to every real key of its segment (never to none: softmax of all -inf is NaN)
    qpos = torch.tensor([[pos[t] if t < n else 1 << 30 for t in row] for row in qi], device=device)  # [S, Lq]
    kpos = torch.tensor([[pos[t] if t < n else 1 << 30 for t in row] for row in ki], device=device)  # [S, Lk]
    allowed = (kpos[:, None, :] <= qpos[:, :, None]) & (kpos < (1 << 30))[:, None, :]  # [S, Lq, Lk]
    slot = torch.empty(n, dtype=torch.long)
    flat = torch.tensor(qi).flatten()
    real = flat < n
    slot[flat[real]] = torch.arange(len(flat))[real]
    return Segments(torch.tensor(qi, device=device), torch.tensor(ki, device=device), allowed[:, None],
                    slot.to(device))


def pad_row(x: Tensor) -> Tensor:
    """x with one zero row appended: the padding slot's value (index N of N packed tokens)."""
    return torch.cat([x, x.new_zeros(1, *x.shape[1:])])


def rope_tables(config, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """[N, 1, D] cos and sin of each position (rows of a table made once per model shape and device)."""
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cos, sin = _rope_table(float(config.rope_parameters["rope_theta"]), d, config.max_position_embeddings,
                           str(positions.device), dtype)
    return cos[positions][:, None], sin[positions][:, None]


@functools.lru_cache(maxsize=8)
def _rope_table(theta: float, d: int, length: int, device: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """[length, D] cos and sin, computed as transformers' default rope does (float32, then cast)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float, device=device) / d))
    freqs = torch.arange(length, dtype=torch.float, device=device)[:, None] * inv_freq  # [length, D/2]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def short_softmax(x: Tensor) -> Tensor:
    """softmax over a short last dim (a segment's ~5-15 keys). torch's softmax kernel costs ~10 ns per element
    at that width on CPU (100 us for 10k elements, 2 threads), these five elementwise ops about a third of it.
    The max is detached: softmax is shift-invariant, so that is exact and spares autograd the max's backward.
    Every row has at least one finite entry (segments never leave a query without keys)."""
    e = (x - x.amax(-1, keepdim=True).detach()).exp()
    return e / e.sum(-1, keepdim=True)


def segment_attention(q: Tensor, k: Tensor, v: Tensor, seg: Segments) -> Tensor:
    """q [N, H, D], k/v [N + 1, Hkv, D] (last row: padding) -> [N, H, D]. Gathers with index_select
    (its backward is index_add, far cheaper on CPU than advanced indexing's index_put)."""
    n, h, d = q.shape
    s, lq = seg.q_index.shape
    hkv, lk = k.shape[1], seg.k_index.shape[1]
    g = h // hkv
    qp = pad_row(q).index_select(0, seg.q_index.flatten())  # [S*Lq, H, D]
    qp = qp.view(s, lq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(s, hkv, g * lq, d)  # query head = kv head * g + j
    kp = k.index_select(0, seg.k_index.flatten()).view(s, lk, hkv, d).permute(0, 2, 3, 1)  # [S, Hkv, D, Lk]
    vp = v.index_select(0, seg.k_index.flatten()).view(s, lk, hkv, d).transpose(1, 2)  # [S, Hkv, Lk, D]
    scores = (qp @ kp).view(s, hkv, g, lq, lk) * d**-0.5
    scores = scores.masked_fill(~seg.allowed[:, None], float("-inf"))  # [S, Hkv, G, Lq, Lk]
    o = short_softmax(scores).view(s, hkv, g * lq, lk) @ vp  # [S, Hkv, G*Lq, D]
    o = o.view(s, hkv, g, lq, d).permute(0, 3, 1, 2, 4).reshape(s * lq, h, d)
    return o.index_select(0, seg.slot_of_token)  # [N, H, D]


def fused_weights(model) -> list[tuple[Tensor, Tensor, Optional[Tensor]]]:
    """Per layer: q/k/v stacked [(H + 2 Hkv) D, d] and gate/up stacked [2 F, d], one GEMM each, and qwen3's
    q/k norm weights stacked per head [H + Hkv, D] (one norm over q and k together; None for llama).
    Built per forward in training (autograd reaches the parameters through the cat); once per generate
    call in decoding."""
    c = model.config
    out = []
    for layer in model.model.layers:
        a = layer.self_attn
        qk_norm = (torch.cat([a.q_norm.weight.expand(c.num_attention_heads, -1), a.k_norm.weight.expand(c.num_key_value_heads, -1)])
                   if hasattr(a, "q_norm") else None)
        out.append((torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                    torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]), qk_norm))
    return out


def decode_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """One query per row: q [A, H, D], k/v [A, Hkv, K, D], bias [A, 1, 1, K] (0 or -inf) -> [A, H, D]. Plain
    batched matmuls (for a single query, cheaper on CPU than SDPA's flash kernel)."""
    a, h, d = q.shape
    hkv = k.shape[1]
    scores = (q * d**-0.5).view(a, hkv, h // hkv, d) @ k.transpose(-1, -2) + bias  # [A, Hkv, G, K]
    return (short_softmax(scores) @ v).reshape(a, h, d)  # [A, Hkv, G, D] -> [A, H, D]


def project_qkv(config, h: Tensor, w_qkv: Tensor, qk_norm: Optional[Tensor], cos: Tensor,
                sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """h [N, d] -> q [N, H, D], k and v [N, Hkv, D]: q and k normed per head (qwen3) and rotated together."""
    d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    hq, hkv = config.num_attention_heads, config.num_key_value_heads
    qkv = (h @ w_qkv.t()).view(-1, hq + 2 * hkv, d)
    qk, v = qkv[:, : hq + hkv], qkv[:, hq + hkv :]
    if qk_norm is not None:
        qk = F.rms_norm(qk, (d,), None, config.rms_norm_eps) * qk_norm  # [N, H + Hkv, D]
    qk = rotate(qk, cos, sin)
    return qk[:, :hq], qk[:, hq:], v


def mlp(block, h: Tensor, w_gate_up: Tensor) -> Tensor:
    gate, up = (h @ w_gate_up.t()).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ block.down_proj.weight.t()


def packed_forward(model, ids: Tensor, positions: Tensor, attend, weights=None) -> Tensor:
    """ids/positions [N] -> final hidden states [N, d]. attend(layer, q, k, v) -> [N, H, D] is the
    attention of one layer over the packed tokens (it decides who sees whom); weights: fused_weights(model)."""
    config, body = model.config, model.model
    weights = weights or fused_weights(model)
    x = body.embed_tokens(ids)  # [N, d]
    cos, sin = rope_tables(config, positions, x.dtype)
    for i, (layer, (w_qkv, w_gate_up, qk_norm)) in enumerate(zip(body.layers, weights)):
        h = rms_norm(x, layer.input_layernorm.weight, config.rms_norm_eps)
        q, k, v = project_qkv(config, h, w_qkv, qk_norm, cos, sin)
        o = attend(i, q, k, v)  # [N, H, D]
        x = x + o.reshape(len(ids), -1) @ layer.self_attn.o_proj.weight.t()
        x = x + mlp(layer.mlp, rms_norm(x, layer.post_attention_layernorm.weight, config.rms_norm_eps), w_gate_up)
    return rms_norm(x, body.norm.weight, config.rms_norm_eps)


def lm_head(model, hidden: Tensor) -> Tensor:
    return hidden @ model.lm_head.weight.t()  # [N, V]
