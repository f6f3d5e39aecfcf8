"""Checks of the model against the training settings: the checkpoint directory exists, and the learning rate
is one a model of this size survives.

The size is counted from the dimensions (config.json's when `model.hf_checkpoint` holds one, else the model
group's fields), never by building the model. Two learning-rate rules:
- too high for a real-size model (>= REAL_SIZE parameters): the embedded default's train.lr=2e-4 is tuned for a
  1M-parameter model and reaches any `model=` option a user picks; slime and verl run RL of 0.6B-70B models at
  1e-6. Refused when the weights come from a checkpoint (model.hf_checkpoint or load=: a trained model is what
  gets destroyed), a warning for a random init, whose warm start is all there is to lose;
  `train.allow_unsafe_lr=true` lifts both (a random-init "checkpoint" taught one task learns at 1e-4: the
  qwen3-0.6b experiments set it).
- too low for the torch trainer in half precision: it updates the weights in model.dtype with no fp32 master
  copy, so an AdamW step (about train.lr per element) smaller than half a bf16 step of the weight rounds away.
  A warning: the run is wasted, not harmful (benchmarks that only time a step do this on purpose).
Left out: batch shapes (the trainers chunk what they materialise; an out-of-memory error names itself).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional

from slime_hydra.config.schema import ModelConfig, RunConfig
from slime_hydra.errors import Missing

REAL_SIZE = 100_000_000  # parameters from which the high-lr rule applies
MAX_RL_LR = 1e-5  # the highest train.lr / train.critic_lr accepted for a real-size model
SAFE_RL_LR = 1e-6  # slime's reset default (--lr 1e-6) and verl's actor.optim.lr in their GRPO recipes
MANTISSA_BITS = {"bfloat16": 8, "float16": 11}  # significant bits (implicit one included)
MEDIAN_ABS_NORMAL = 0.6745  # median |w| of w ~ N(0, s) is 0.6745 s


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


def check_model_training(cfg: RunConfig, problems: list[str], notes: list[str]) -> None:
    m, t = cfg.model, cfg.train
    if m.hf_checkpoint and t.backend != "megatron" and not (Path(m.hf_checkpoint) / "config.json").is_file():
        # (train.backend=megatron: its config.json check reports the same)
        problems.append(Missing(f"model.hf_checkpoint={m.hf_checkpoint}: config.json not found; point model.hf_checkpoint at a "
                                "Hugging Face model directory (a random one: python -m slime_hydra.models.random_checkpoint "
                                f"{m.hf_checkpoint} model=<option>)", "model.hf_checkpoint", m.hf_checkpoint))
    params, source = model_size(m)
    check_high_lr(cfg, params, source, problems, notes)
    check_half_precision_lr(cfg, notes)


def check_high_lr(cfg: RunConfig, params: int, source: str, problems: list[str], notes: list[str]) -> None:
    t = cfg.train
    if params < REAL_SIZE or t.allow_unsafe_lr:
        return
    keys = [("train.lr", t.lr)]
    if t.critic_lr is not None:  # set: checked whether or not the estimator has a critic (config/ cannot see which)
        keys.append(("train.critic_lr", t.critic_lr))
    trained = "model.hf_checkpoint" if cfg.model.hf_checkpoint else ("load" if cfg.load else None)
    for key, lr in keys:
        if lr <= MAX_RL_LR:
            continue
        why = (f"{key}={lr:g} is too high for RL of a {params / 1e6:,.0f}M-parameter model ({source}; the rule applies "
               f"from {REAL_SIZE / 1e6:.0f}M): above {MAX_RL_LR:g} a few steps can wreck what a trained model knows; set "
               f"{key}={SAFE_RL_LR:g} (slime's and verl's default) or at most {MAX_RL_LR:g}, or "
               "train.allow_unsafe_lr=true to run it anyway")
        if trained:
            problems.append(why + f" (refused: the weights come from {trained})")
        else:
            notes.append("warning: " + why)


def max_lost_lr(dtype: str, weight_scale: float) -> Optional[float]:
    """The train.lr below which an AdamW step (~lr per element) is under half a `dtype` step for the median
    weight of N(0, weight_scale), so that weight keeps its value; None for float32/float64 (2^-24: no issue at
    learning rates in use). The bf16 step of |w| in [2^e, 2^(e+1)) is 2^(e-7); half of it is at least |w| 2^-9."""
    bits = MANTISSA_BITS.get(dtype)
    if bits is None:
        return None
    return MEDIAN_ABS_NORMAL * weight_scale * 2.0 ** -(bits + 1)


def check_half_precision_lr(cfg: RunConfig, notes: list[str]) -> None:
    m, t = cfg.model, cfg.train
    bound = max_lost_lr(m.dtype, m.init_std) if t.backend == "torch" else None  # megatron keeps fp32 main params
    if bound is None or t.lr >= bound:
        return
    notes.append(f"warning: train.backend=torch updates the weights in model.dtype={m.dtype} itself (no fp32 copy): an "
                 f"AdamW step of about train.lr={t.lr:g} per element is below half a {m.dtype} step of any weight larger "
                 f"than {t.lr * 2 ** MANTISSA_BITS[m.dtype]:.1e}, so it rounds away for most of them (the median |w| of a "
                 f"std-{m.init_std:g} init is {MEDIAN_ABS_NORMAL * m.init_std:.1e}: needs train.lr >= {bound:.1e}) and the "
                 "model barely trains; set model.dtype=float32 (fp32 weights in the trainer and the engine) or "
                 "train.backend=megatron (fp32 main params)")
