"""The local rollout's forward passes: prefill the distinct contexts, then one token per row per step.

Two implementations of one small interface (`model.model_impl` picks):
- `TransformersDecoder`: the model's own forward with a `DynamicCache`, every row every step.
- `PackedDecoder` (`native`): models/native.py over packed tokens; a row that has finished costs
  nothing, and each context's keys are written once into a preallocated per-layer cache.
Both return [B, V] next-token logits for the B rows; rows not active in a step get zeros.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from slime_hydra.models.native import decode_attention, lm_head, native_weights, packed_forward, segment_attention, segments


class Decoder(Protocol):
    def prefill(self, contexts: list[tuple[int, ...]], rows: list[int], max_new_tokens: int) -> Tensor: ...

    def step(self, tokens: Tensor, active: Tensor) -> Tensor: ...


class TransformersDecoder:
    def __init__(self, model: torch.nn.Module, pad_id: int):
        self.model, self.pad_id = model, pad_id
        self.device = next(model.parameters()).device

    def prefill(self, contexts: list[tuple[int, ...]], rows: list[int], max_new_tokens: int) -> Tensor:
        """contexts: the U distinct contexts; rows [B]: each row's context. -> [B, V]"""
        from transformers import DynamicCache

        L = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), L), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(contexts), L), dtype=torch.long)
        for i, ctx in enumerate(contexts):  # left padding
            ids[i, L - len(ctx) :] = torch.tensor(ctx)
            attn[i, L - len(ctx) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)  # [U, L]
        self.cache = DynamicCache(config=self.model.config)
        logits = self._forward(ids, attn, pos)
        if len(contexts) < len(rows):
            index = torch.tensor(rows, device=self.device)
            self.cache.batch_select_indices(index)
            logits, attn, pos = logits[index], attn[index], pos[index]  # [B, V], [B, L], [B, L]
        self.attn, self.pos = attn, pos
        return logits

    def step(self, tokens: Tensor, active: Tensor) -> Tensor:
        """tokens [B] (every row runs; `active` is only a hint here) -> [B, V]"""
        self.attn = torch.cat([self.attn, torch.ones((len(tokens), 1), dtype=self.attn.dtype, device=self.device)], 1)
        self.pos = self.pos[:, -1:] + 1
        return self._forward(tokens[:, None], self.attn, self.pos)

    # inference mode (no autograd, no version counters: ~5% of a rollout of the embedded default in eager ops), per
    # call, not around an await: the mode is per thread, and coroutines interleave
    @torch.inference_mode()
    def _forward(self, ids: Tensor, attn: Tensor, pos: Tensor) -> Tensor:
        return self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=self.cache,
                          use_cache=True).logits[:, -1]


class PackedDecoder:
    """The cache holds the still-active rows only, [A, Hkv, L + max_new, D] per layer: a row that finishes is
    dropped from it once (one index_select per layer), not gathered out of it at every step; each step writes
    one column and attends to the columns before it (a view). Generated columns line up across rows (every
    active row adds one token per step); a row's context columns past its own length carry a -inf bias."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def prefill(self, contexts: list[tuple[int, ...]], rows: list[int], max_new_tokens: int) -> Tensor:
        tokens = [t for ctx in contexts for t in ctx]
        length = torch.tensor([len(c) for c in contexts])  # [U]
        start = length.cumsum(0) - length  # [U]
        positions = torch.arange(len(tokens)) - start.repeat_interleave(length)  # [N]
        seg = segments(start, length, start, torch.zeros_like(length), positions, self.device)
        b, L = len(rows), int(length.max())
        row_of = torch.tensor(rows)  # [B] each row's context
        j = torch.arange(L)[None]  # [1, L]
        lengths = length[row_of]  # [B]
        # [B, L] packed token of each row's context key slot (token 0 past its end: masked by the bias)
        slot = torch.where(j < lengths[:, None], start[row_of][:, None] + j, 0).to(self.device)
        self.k, self.v = [], []
        self.weights = native_weights(self.model)  # fixed for the whole generate call

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            for src, caches in ((k, self.k), (v, self.v)):
                cache = src.new_zeros(b, src.shape[1], L + max_new_tokens, src.shape[2])  # [B, Hkv, L + max_new, D]
                cache[:, :, :L] = src[slot].transpose(1, 2)
                caches.append(cache)
            return segment_attention(q, k, v, seg)

        last = (start + length - 1).to(self.device)  # [U] each context's last token: the only hidden state read
        hidden = packed_forward(self.weights, torch.tensor(tokens, device=self.device), positions.to(self.device), attend,
                                out=last)  # [U, d]
        self.bias = torch.zeros(b, L + max_new_tokens, dtype=hidden.dtype, device=self.device)  # [B, K]
        self.bias[:, :L].masked_fill_((j >= lengths[:, None]).to(self.device), float("-inf"))
        self.rows = torch.arange(b, device=self.device)  # the rows the cache holds
        self.next_pos, self.column = lengths.to(self.device), L
        return lm_head(self.weights, hidden)[row_of.to(self.device)]  # [B, V]

    @torch.inference_mode()
    def step(self, tokens: Tensor, active: Tensor) -> Tensor:
        """tokens [B], active [B] (a subset of the rows active before) -> [B, V]"""
        if int(active.sum()) != len(self.rows):  # rows finished since the last step: drop them, once
            keep = active[self.rows].nonzero().flatten()  # [A] positions in the cache
            self.k = [c.index_select(0, keep) for c in self.k]
            self.v = [c.index_select(0, keep) for c in self.v]
            self.bias, self.next_pos, self.rows = self.bias[keep], self.next_pos[keep], self.rows[keep]
        col = self.column
        bias = self.bias[:, None, None, : col + 1]  # [A, 1, 1, K']

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # q [A, H, D], k/v [A, Hkv, D]
            kc, vc = self.k[layer], self.v[layer]
            kc[:, :, col], vc[:, :, col] = k, v
            return decode_attention(q, kc[:, :, : col + 1], vc[:, :, : col + 1], bias)

        hidden = packed_forward(self.weights, tokens[self.rows], self.next_pos, attend)
        self.next_pos += 1
        self.column += 1
        logits = hidden.new_zeros(len(tokens), self.weights.head_t.shape[1])
        return logits.index_copy_(0, self.rows, lm_head(self.weights, hidden))
