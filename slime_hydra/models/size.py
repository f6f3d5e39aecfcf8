"""A model's parameter count and context length from its dimensions (config.json's when `model.hf_checkpoint` holds
one, else the model group's fields), never by building the model: the learning-rate checks (models/checks.py), the
random checkpoint writer and the prompt-length limit (app/derive.py) read them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from slime_hydra.config.schema import ModelConfig


def hf_dims(hf: dict) -> dict:
    """config.json -> ModelConfig field values that decide the parameter count (keys it lacks are left out)."""
    hf = hf.get("text_config", hf)
    names = {"num_hidden_layers": "num_layers", "hidden_size": "hidden_size", "intermediate_size": "ffn_hidden_size",
             "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_query_groups",
             "head_dim": "kv_channels", "vocab_size": "vocab_size", "moe_intermediate_size": "moe_ffn_hidden_size",
             "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank", "qk_nope_head_dim": "qk_head_dim",
             "qk_rope_head_dim": "qk_pos_emb_head_dim", "v_head_dim": "v_head_dim"}
    out = {ours: hf[theirs] for theirs, ours in names.items() if hf.get(theirs) is not None}
    if "head_dim" not in hf and "hidden_size" in hf and "num_attention_heads" in hf:
        out["kv_channels"] = hf["hidden_size"] // hf["num_attention_heads"]
    if "tie_word_embeddings" in hf:
        out["untie_embeddings_and_output_weights"] = not hf["tie_word_embeddings"]
    out["num_experts"] = hf.get("num_experts") or hf.get("n_routed_experts") or hf.get("num_local_experts") or None
    out["multi_latent_attention"] = "kv_lora_rank" in hf
    out["add_qkv_bias"] = bool(hf.get("attention_bias") or hf.get("qkv_bias") or hf.get("model_type") == "qwen2")
    return out


def num_parameters(m: ModelConfig) -> int:
    """Parameters of a model described by its fields: exact for dense Qwen3/Llama/Qwen2 blocks (Qwen3-0.6B:
    596,049,920), within a few per cent for MoE and MLA (routers' biases, shared-expert gates left out; a moe_layer_freq
    expression string counts every layer as MoE, an upper bound).
    model.vocab_size unset (the character tokenizer's ~70 tokens) counts no embedding rows."""
    h, v, kv, heads, groups = m.hidden_size, m.vocab_size or 0, m.kv_channels, m.num_attention_heads, m.num_query_groups
    mats = 3 if m.swiglu else 2
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk) if m.q_lora_rank else h * heads * qk
        attn = q + h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank \
            + m.kv_lora_rank * heads * (m.qk_head_dim + m.v_head_dim) + heads * m.v_head_dim * h
    else:
        attn = h * heads * kv + 2 * h * groups * kv + heads * kv * h
        attn += (heads * kv + 2 * groups * kv) if m.add_qkv_bias else 0
        attn += 2 * kv if m.qk_layernorm else 0
    norms = h * (2 + m.post_self_attn_layernorm + m.post_mlp_layernorm)
    dense_mlp = mats * h * m.ffn_hidden_size
    if m.num_experts:
        moe_mlp = m.num_experts * (mats * h * (m.moe_ffn_hidden_size or 0) + h)  # experts and the router's rows
        moe_mlp += mats * h * (m.moe_shared_expert_intermediate_size or 0)
        freq = m.moe_layer_freq  # an int k (every k-th layer), a 0/1 list; an expression string counts as all MoE
        pattern = ([int(i % freq == 0) for i in range(m.num_layers)] if isinstance(freq, int) and freq > 0 else
                   [int(x) for x in freq] if isinstance(freq, (list, tuple)) else [1] * m.num_layers)
        layers = sum(attn + norms + (moe_mlp if is_moe else dense_mlp) for is_moe in pattern)
    else:
        layers = m.num_layers * (attn + norms + dense_mlp)
    return layers + v * h * (2 if m.untie_embeddings_and_output_weights else 1) + h


def model_size(m: ModelConfig) -> tuple[int, str]:
    """(parameters, where the dimensions came from): config.json in model.hf_checkpoint if there is one."""
    if m.hf_checkpoint:
        path = Path(m.hf_checkpoint) / "config.json"
        try:
            hf = json.loads(path.read_text())
        except (OSError, ValueError):  # missing or broken: reported by the checkpoint checks
            hf = None
        if isinstance(hf, dict):
            fields = {f.name for f in dataclasses.fields(ModelConfig)}
            dims = {k: v for k, v in hf_dims(hf).items() if k in fields}
            return num_parameters(dataclasses.replace(m, **dims)), str(path)
    return num_parameters(m), f"the model group's fields (model={m.name})"


def context_length(m: ModelConfig) -> tuple[Optional[int], str]:
    """(the longest sequence the model runs, in tokens; where that comes from): config.json's max_position_embeddings
    when model.hf_checkpoint holds one, else model.max_position_embeddings; None when config.json has none or does not
    parse (its own check reports that)."""
    if m.hf_checkpoint and (path := Path(m.hf_checkpoint) / "config.json").is_file():
        try:
            hf = json.loads(path.read_text())
        except (OSError, ValueError):
            return None, f"{path} does not parse"
        n = hf.get("text_config", hf).get("max_position_embeddings") if isinstance(hf, dict) else None
        return (n, f"max_position_embeddings of {path}") if isinstance(n, int) else (None, f"{path} has none")
    return m.max_position_embeddings, "model.max_position_embeddings"
