"""Tiny random HF models of the converter's families, each with the model option (and overrides) that describes it.

Sizes are small but keep every shape distinct (h != 2 * moe_ffn, q/k head dim != v head dim), so a
transposed or mis-split tensor fails the round trip instead of slipping through.
"""

from __future__ import annotations

import torch

COMMON = ["model.num_layers=2", "model.hidden_size=48", "model.ffn_hidden_size=64", "model.num_attention_heads=4",
          "model.vocab_size=64", "model.max_position_embeddings=128", "model.dtype=float32", "model.init_std=0.1"]
MOE = ["model.num_experts=4", "model.moe_router_topk=2", "model.moe_ffn_hidden_size=16"]
MLA = ["model.num_query_groups=4", "model.kv_lora_rank=8", "model.qk_head_dim=8", "model.qk_pos_emb_head_dim=4",
       "model.v_head_dim=6", "model.moe_layer_freq=[0,1]", "model.moe_shared_expert_intermediate_size=16"]

FAMILIES = {  # name -> (model option, overrides)
    "qwen3_moe": ("qwen3_30b_a3b", [*COMMON, *MOE, "model.num_query_groups=2", "model.kv_channels=8"]),
    "deepseek_v3": ("deepseek_v3", [*COMMON, *MOE, *MLA, "model.q_lora_rank=16", "model.moe_router_num_groups=2",
                                    "model.moe_router_group_topk=1"]),
    "moonlight": ("moonlight_16b", [*COMMON, *MOE, *MLA]),  # MLA without query compression
    "glm4": ("glm4_9b", [*COMMON, "model.num_query_groups=2", "model.kv_channels=12"]),
}


def hf_config(family: str, m):
    """The transformers config of `family` matching ModelConfig `m` field by field."""
    from transformers import DeepseekV3Config, Glm4Config, Qwen3MoeConfig

    base = dict(vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.ffn_hidden_size,
                num_hidden_layers=m.num_layers, num_attention_heads=m.num_attention_heads, rms_norm_eps=m.norm_epsilon,
                max_position_embeddings=m.max_position_embeddings, tie_word_embeddings=False, initializer_range=m.init_std,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "qwen3_moe":
        return Qwen3MoeConfig(**base, num_key_value_heads=m.num_query_groups, head_dim=m.kv_channels, rope_theta=m.rotary_base,
                              num_experts=m.num_experts, num_experts_per_tok=m.moe_router_topk, norm_topk_prob=True,
                              moe_intermediate_size=m.moe_ffn_hidden_size, decoder_sparse_step=1, mlp_only_layers=[])
    if family == "glm4":
        return Glm4Config(**base, num_key_value_heads=m.num_query_groups, head_dim=m.kv_channels, attention_bias=True,
                          rope_parameters={"rope_type": "default", "rope_theta": m.rotary_base,
                                           "partial_rotary_factor": m.rotary_percent})
    rope = {"rope_type": "yarn", "rope_theta": m.rotary_base, "factor": m.rotary_scaling_factor,
            "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1, "mscale": m.mscale,
            "mscale_all_dim": m.mscale_all_dim}
    return DeepseekV3Config(**base, num_key_value_heads=m.num_query_groups, moe_intermediate_size=m.moe_ffn_hidden_size,
                            n_routed_experts=m.num_experts, num_experts_per_tok=m.moe_router_topk,
                            n_shared_experts=m.moe_shared_expert_intermediate_size // m.moe_ffn_hidden_size,
                            first_k_dense_replace=1, n_group=m.moe_router_num_groups, topk_group=m.moe_router_group_topk,
                            routed_scaling_factor=m.moe_router_topk_scaling_factor, norm_topk_prob=True,
                            q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.qk_head_dim,
                            qk_rope_head_dim=m.qk_pos_emb_head_dim, v_head_dim=m.v_head_dim, rope_parameters=rope,
                            rope_interleave=True)


def build(family: str, out_dir, seed: int = 0):
    """(RunConfig with train=megatron, HF model, its saved directory) for `family`."""
    from transformers import AutoModelForCausalLM

    from slime_hydra.app.preflight import compose_run
    from slime_hydra.config.store import register

    register()
    option, overrides = FAMILIES[family]
    cfg = compose_run(["train=megatron", f"model={option}", *overrides])
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(hf_config(family, cfg.model), dtype=torch.float32).eval()
    with torch.no_grad():  # router biases start at zero: give them values so their conversion is tested
        for name, t in [*hf.named_buffers(), *hf.named_parameters()]:
            if name.endswith("e_score_correction_bias"):
                t.copy_(torch.randn_like(t) * 0.1)
    hf.save_pretrained(out_dir)
    return cfg, hf
