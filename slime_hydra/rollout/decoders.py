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

from slime_hydra.models.native import (decode_attention, fused_weights, lm_head, packed_forward, pad_row, segment_attention,
                                       segments)


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

    @torch.no_grad()  # per call, not around an await: grad mode is per thread, and coroutines interleave
    def _forward(self, ids: Tensor, attn: Tensor, pos: Tensor) -> Tensor:
        return self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=self.cache,
                          use_cache=True).logits[:, -1]


class PackedDecoder:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def prefill(self, contexts: list[tuple[int, ...]], rows: list[int], max_new_tokens: int) -> Tensor:
        starts, tokens, positions = [], [], []
        for ctx in contexts:
            starts.append(len(tokens))
            tokens += ctx
            positions += range(len(ctx))
        spans = [list(range(s, s + len(c))) for s, c in zip(starts, contexts)]
        seg = segments(spans, spans, positions, self.device)
        L = max(len(c) for c in contexts)
        # [B, L] packed token of each row's context key slot (padding slot past its end)
        slot = torch.tensor([[starts[u] + j if j < len(contexts[u]) else len(tokens) for j in range(L)] for u in rows],
                            device=self.device)
        self.k, self.v = [], []
        self.weights = fused_weights(self.model)  # fixed for the whole generate call

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            k, v = pad_row(k), pad_row(v)
            new = k.new_zeros(len(rows), max_new_tokens, *k.shape[1:])  # [B, max_new, Hkv, D]
            self.k.append(torch.cat([k[slot], new], 1).transpose(1, 2).contiguous())  # [B, Hkv, L + max_new, D]
            self.v.append(torch.cat([v[slot], new], 1).transpose(1, 2).contiguous())
            return segment_attention(q, k, v, seg)

        hidden = packed_forward(self.model, torch.tensor(tokens, device=self.device),
                                torch.tensor(positions, device=self.device), attend, self.weights)
        last = torch.tensor([s + len(c) - 1 for s, c in zip(starts, contexts)], device=self.device)
        lengths = torch.tensor([len(contexts[u]) for u in rows], device=self.device)
        self.valid = torch.arange(L + max_new_tokens, device=self.device)[None] < lengths[:, None]  # [B, L + max_new]
        self.next_pos, self.column = lengths.clone(), L
        return lm_head(self.model, hidden[last])[torch.tensor(rows, device=self.device)]  # [B, V]

    @torch.no_grad()
    def step(self, tokens: Tensor, active: Tensor) -> Tensor:
        rows = active.nonzero().flatten()  # [A]
        col = self.column
        self.valid[rows, col] = True
        valid = self.valid.index_select(0, rows)  # [A, K]
        bias = torch.zeros(valid.shape, dtype=self.k[0].dtype, device=self.device).masked_fill_(~valid, float("-inf"))

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # q [A, H, D], k/v [A, Hkv, D]
            self.k[layer][rows, :, col], self.v[layer][rows, :, col] = k, v
            return decode_attention(q, self.k[layer].index_select(0, rows), self.v[layer].index_select(0, rows),
                                    bias[:, None, None])

        hidden = packed_forward(self.model, tokens[rows], self.next_pos[rows], attend, self.weights)
        self.next_pos[rows] += 1
        self.column += 1
        logits = torch.zeros(len(tokens), self.model.lm_head.weight.shape[0], device=self.device, dtype=hidden.dtype)
        logits[rows] = lm_head(self.model, hidden)
        return logits

