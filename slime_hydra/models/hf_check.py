"""Does a model option match a Hugging Face config.json? Field by field, naming each mismatch.

The megatron backend builds its GPTModel from the `model` group's fields and then loads the
checkpoint's tensors into it, so a wrong field there is a silent shape error or, worse, a model
that loads and computes something else (a wrong rope base or norm eps). slime's
`_hf_validate_args` compares the same fields; this is that check as a function of
(ModelConfig, config.json dict), used by validation (train.backend=megatron with
model.hf_checkpoint) and by the CLI (cli.py):

    slime-hydra check-hf /path/to/config.json model=qwen3_4b [more overrides]

It reads JSON only: no transformers import, no trust_remote_code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

from slime_hydra.config.schema import ModelConfig
from slime_hydra.errors import Missing

_ABSENT = object()


def moe_layer_pattern(freq: Any, num_layers: int) -> list[int]:
    """megatron's moe_layer_freq -> [num_layers] of 0 (dense) / 1 (MoE).

    An int k: every k-th layer is MoE (1: all). A list: the pattern itself. A string: megatron's
    expression form "([0]*3+[1]*58)" or "[1,0,1]" (parsed, not eval'd).
    """
    if isinstance(freq, int):
        return [1 if i % freq == 0 else 0 for i in range(num_layers)]
    if isinstance(freq, (list, tuple)):
        return [int(x) for x in freq]
    text = str(freq).strip().strip("()").replace(" ", "")
    if re.fullmatch(r"\d+", text):
        return moe_layer_pattern(int(text), num_layers)
    out: list[int] = []
    for term in text.split("+"):
        m = re.fullmatch(r"\[([\d,]*)\](?:\*(\d+))?", term)
        if not m:
            raise ValueError(f"moe_layer_freq={freq!r}: expected an int, a list or an expression like ([0]*3+[1]*58)")
        out += [int(x) for x in m.group(1).split(",") if x] * int(m.group(2) or 1)
    return out


def _rope_theta(hf: dict) -> Any:
    params = hf.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return params["rope_theta"]
    return hf.get("rope_theta", _ABSENT)


def _rope_factor(hf: dict) -> Any:
    scaling = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    return scaling.get("factor", _ABSENT) if isinstance(scaling, dict) else _ABSENT


def _shared_expert_size(hf: dict) -> Any:
    if "shared_expert_intermediate_size" in hf:  # qwen2-moe style
        return hf["shared_expert_intermediate_size"] or None
    if "n_shared_experts" in hf and "moe_intermediate_size" in hf:  # deepseek style
        return (hf["n_shared_experts"] or 0) * hf["moe_intermediate_size"] or None
    return _ABSENT


def _first_dense(hf: dict) -> Any:
    if "first_k_dense_replace" in hf:
        return hf["first_k_dense_replace"]
    if "decoder_sparse_step" in hf or "mlp_only_layers" in hf:  # qwen3-moe: all MoE unless listed
        return 0 if not hf.get("mlp_only_layers") and hf.get("decoder_sparse_step", 1) == 1 else _ABSENT
    return _ABSENT


def _get(hf: dict, *keys: str) -> Any:
    for k in keys:
        if k in hf:
            return hf[k]
    return _ABSENT


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    return a == b


# (model field, config.json name(s) as written in messages, getter(hf) -> value or _ABSENT, applies(model))
def _rows(m: ModelConfig) -> list[tuple[str, str, Callable[[dict], Any], Callable[[Any], Any]]]:
    moe, mla = m.num_experts is not None, m.multi_latent_attention
    same = lambda v: v  # noqa: E731
    rows = [
        ("num_layers", "num_hidden_layers", lambda h: _get(h, "num_hidden_layers", "num_layers"), same),
        ("hidden_size", "hidden_size", lambda h: _get(h, "hidden_size"), same),
        ("num_attention_heads", "num_attention_heads", lambda h: _get(h, "num_attention_heads"), same),
        ("rotary_base", "rope_theta", _rope_theta, same),
        ("norm_epsilon", "rms_norm_eps", lambda h: _get(h, "rms_norm_eps", "layer_norm_eps", "layernorm_epsilon"), same),
        ("vocab_size", "vocab_size", lambda h: _get(h, "vocab_size", "padded_vocab_size"), same),
        # tie_word_embeddings is the negation of untie_embeddings_and_output_weights
        ("untie_embeddings_and_output_weights", "tie_word_embeddings", lambda h: _get(h, "tie_word_embeddings"),
         lambda v: not v),
    ]
    if not moe or 0 in moe_layer_pattern(m.moe_layer_freq, m.num_layers):  # a dense MLP exists somewhere
        rows.append(("ffn_hidden_size", "intermediate_size", lambda h: _get(h, "intermediate_size", "ffn_hidden_size"), same))
    if not mla:
        rows += [("num_query_groups", "num_key_value_heads", lambda h: _get(h, "num_key_value_heads", "num_attention_heads"), same),
                 ("kv_channels", "head_dim", lambda h: _get(h, "head_dim") if "head_dim" in h else
                  (h["hidden_size"] // h["num_attention_heads"] if "hidden_size" in h and "num_attention_heads" in h else _ABSENT), same)]
    else:
        rows += [("q_lora_rank", "q_lora_rank", lambda h: _get(h, "q_lora_rank"), same),
                 ("kv_lora_rank", "kv_lora_rank", lambda h: _get(h, "kv_lora_rank"), same),
                 ("qk_head_dim", "qk_nope_head_dim", lambda h: _get(h, "qk_nope_head_dim"), same),
                 ("qk_pos_emb_head_dim", "qk_rope_head_dim", lambda h: _get(h, "qk_rope_head_dim"), same),
                 ("v_head_dim", "v_head_dim", lambda h: _get(h, "v_head_dim"), same)]
    if m.use_rope_scaling or mla:
        rows.append(("rotary_scaling_factor", "rope_scaling.factor", _rope_factor, same))
    rows.append(("num_experts", "num_experts / n_routed_experts", lambda h: _get(h, "num_experts", "n_routed_experts", "num_local_experts"), same))
    if moe:
        rows += [
            ("moe_ffn_hidden_size", "moe_intermediate_size", lambda h: _get(h, "moe_intermediate_size"), same),
            ("moe_router_topk", "num_experts_per_tok", lambda h: _get(h, "num_experts_per_tok"), same),
            ("moe_shared_expert_intermediate_size", "n_shared_experts × moe_intermediate_size", _shared_expert_size, same),
            ("moe_router_num_groups", "n_group", lambda h: _get(h, "n_group"), same),
            ("moe_router_group_topk", "topk_group", lambda h: _get(h, "topk_group"), same),
            ("moe_router_topk_scaling_factor", "routed_scaling_factor", lambda h: _get(h, "routed_scaling_factor"), same),
            ("moe_layer_freq", "first_k_dense_replace", _first_dense,
             lambda v: moe_layer_pattern(v, m.num_layers).index(1) if 1 in moe_layer_pattern(v, m.num_layers) else m.num_layers),
        ]
    return rows


def hf_mismatches(model: ModelConfig, hf: dict) -> list[str]:
    """Every field of `model` that disagrees with the HF config dict, one message each."""
    hf = hf.get("text_config", hf)  # multimodal configs nest the language model's
    out = []
    for field, hf_name, get, view in _rows(model):
        theirs = get(hf)
        if theirs is _ABSENT:
            continue
        ours = view(getattr(model, field))
        if field == "num_experts" and theirs in (None, 0) and ours is None:
            continue
        if not _close(ours, theirs):
            out.append(f"model.{field}={getattr(model, field)!r} does not match config.json {hf_name}={theirs!r}; "
                       f"set model.{field} to match the checkpoint (or pick the model option for it)")
    return out


def check_hf_config(model: ModelConfig, config_json: str | Path) -> list[str]:
    path = Path(config_json)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        return [Missing(f"model.hf_checkpoint: {path} not found; point model.hf_checkpoint at a directory holding config.json "
                        f"(a random one: python -m slime_hydra.models.random_checkpoint {path.parent} model=<option>)",
                        "model.hf_checkpoint", path)]
    try:
        hf = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        return [f"{path}:{e.lineno}: not valid JSON ({e.msg})"]
    return [f"{path}: {p}" for p in hf_mismatches(model, hf)]
