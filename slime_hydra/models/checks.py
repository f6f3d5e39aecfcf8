"""Shape rules of a model option, whatever the backend (the zoo must stay self-consistent)."""

from __future__ import annotations

from slime_hydra.config.schema import ModelConfig
from slime_hydra.models.hf_check import moe_layer_pattern


def check(m: ModelConfig) -> list[str]:
    problems = []
    if not m.multi_latent_attention and m.num_attention_heads % m.num_query_groups:
        problems.append(f"model.num_query_groups={m.num_query_groups} must divide model.num_attention_heads={m.num_attention_heads}")
    if m.num_experts is not None:
        try:
            pattern = moe_layer_pattern(m.moe_layer_freq, m.num_layers)
        except ValueError as e:
            problems.append(f"model.{e}")
        else:
            if len(pattern) != m.num_layers:
                problems.append(f"model.moe_layer_freq={m.moe_layer_freq!r} gives {len(pattern)} layers but model.num_layers="
                                f"{m.num_layers}; give one 0/1 per layer")
        if m.moe_ffn_hidden_size is None:
            problems.append("model.num_experts is set but model.moe_ffn_hidden_size is not; set it (HF moe_intermediate_size)")
        if not 1 <= m.moe_router_topk <= m.num_experts:
            problems.append(f"model.moe_router_topk={m.moe_router_topk} must be in [1, model.num_experts={m.num_experts}]")
    if m.normalization not in ("RMSNorm", "LayerNorm"):
        problems.append(f"model.normalization={m.normalization!r} is not one of ['RMSNorm', 'LayerNorm']")
    return problems
