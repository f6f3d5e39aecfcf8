"""Hugging Face weight names as checkpoints and rollout engines spell them, over a transformers model in memory.

transformers >= 5 keeps a MoE layer's experts fused (`mlp.experts.gate_up_proj` [E, 2f, h], `mlp.experts.down_proj`
[E, h, f]); checkpoints, SGLang and the megatron converter name each expert. hub_names gives the per-expert view.
"""

from __future__ import annotations

from typing import Mapping

import torch


def hub_names(hf: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
    """transformers >= 5 keeps a MoE layer's experts fused in memory (`mlp.experts.gate_up_proj` [E, 2f, h],
    `mlp.experts.down_proj` [E, h, f]); checkpoints and the rollout engines name each expert
    (`mlp.experts.{e}.gate_proj.weight`, ...). This gives the latter view (tensor views, no copies)."""
    if not any(k.endswith(".experts.gate_up_proj") for k in hf):
        return hf
    out: dict[str, torch.Tensor] = {}
    for k, t in hf.items():
        if k.endswith(".experts.gate_up_proj"):
            for e in range(t.shape[0]):
                out[f"{k[:-12]}{e}.gate_proj.weight"], out[f"{k[:-12]}{e}.up_proj.weight"] = t[e].chunk(2)
        elif k.endswith(".experts.down_proj"):
            for e in range(t.shape[0]):
                out[f"{k[:-9]}{e}.down_proj.weight"] = t[e]
        else:
            out[k] = t
    return out
