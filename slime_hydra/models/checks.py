"""Checks of the model group, whatever the trainer: the option's shapes (the zoo must stay self-consistent), which
implementation runs it (model.model_impl), its checkpoint directory, and the learning rate a model of its size
survives. The composition floor (app/checks.py) calls them with the groups they read; the derivation step
(app/derive.py) resolves model.model_impl=auto with `resolve_model_impl`.

The learning-rate rule: too high for a real-size model (>= REAL_SIZE parameters, counted from the dimensions by
models/size.py). The embedded default's train.lr=2e-4 is tuned for a 1M-parameter model and reaches any `model=`
option a user picks; slime and verl run RL of 0.6B-70B models at 1e-6. Refused when the weights come from a
checkpoint (model.hf_checkpoint or load=: a trained model is what gets destroyed), a warning for a random init,
whose warm start is all there is to lose; `train.allow_unsafe_lr=true` lifts both (a random-init "checkpoint"
taught one task learns at 1e-4: the qwen3-0.6b experiments set it). The rule for half precision without an fp32
copy is the torch trainer's (training/checks.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from slime_hydra.config.schema import ModelConfig, TrainConfig
from slime_hydra.errors import Missing
from slime_hydra.models.hf_check import moe_layer_pattern
from slime_hydra.models.size import model_size

NATIVE_MODEL_TYPES = ("qwen3", "llama")  # models/native.py: dense blocks, default rope, no biases
REAL_SIZE = 100_000_000  # parameters from which the high-lr rule applies
MAX_RL_LR = 1e-5  # the highest train.lr / train.critic_lr accepted for a real-size model
SAFE_RL_LR = 1e-6  # slime's reset default (--lr 1e-6) and verl's actor.optim.lr in their GRPO recipes


def check(m: ModelConfig) -> list[str]:
    """The option's shapes."""
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


def native_blockers(m: ModelConfig) -> tuple[Optional[list[str]], str]:
    """(what models/native.py cannot run in this model, empty when it runs it; None when model.hf_checkpoint has no
    config.json to read, which the checkpoint's own check reports), and where the facts came from: config.json when
    model.hf_checkpoint is set (JSON only), else the model group's fields."""
    config = {"model_type": m.architecture, "use_rope_scaling": m.use_rope_scaling, "add_qkv_bias": m.add_qkv_bias,
              "num_experts": m.num_experts, "swiglu": m.swiglu, "normalization": m.normalization}
    source = "the model group's fields"
    if m.hf_checkpoint:
        path = Path(m.hf_checkpoint) / "config.json"
        if not path.is_file():
            return None, str(path)
        config, source = json.loads(path.read_text()), str(path)
    why = []
    if config.get("model_type") not in NATIVE_MODEL_TYPES:
        why.append(f"model_type {config.get('model_type')!r} (native runs {', '.join(NATIVE_MODEL_TYPES)})")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        why.append(f"rope_type {rope.get('rope_type', rope.get('type'))!r} (native runs default rope)")
    if config.get("hidden_act", "silu") != "silu":
        why.append(f"hidden_act {config['hidden_act']!r} (native runs silu)")
    why += [f"{flag}=true" for flag in ("attention_bias", "mlp_bias", "use_sliding_window", "use_rope_scaling", "add_qkv_bias")
            if config.get(flag)]
    if config.get("num_experts"):
        why.append("MoE (num_experts set)")
    if not config.get("swiglu", True) or config.get("normalization", "RMSNorm") != "RMSNorm":
        why.append("not an RMSNorm + SwiGLU block")
    if config.get("pretraining_tp", 1) != 1:
        why.append("pretraining_tp != 1")
    return why, source


def resolve_model_impl(m: ModelConfig) -> tuple[str, Optional[str]]:
    """model.model_impl with auto resolved (native where models/native.py runs the model, transformers elsewhere), and
    the note saying so (None when nothing was resolved, or config.json is missing: its check reports that)."""
    if m.model_impl != "auto":
        return m.model_impl, None
    why, _ = native_blockers(m)
    if why is None:
        return "transformers", None
    impl = "transformers" if why else "native"
    return impl, f"model.model_impl=auto: {impl}" + (f" ({'; '.join(why)})" if why else "")


def check_model_impl(m: ModelConfig) -> list[str]:
    """model.model_impl=native runs only what models/native.py implements."""
    if m.model_impl != "native":
        return []
    why, source = native_blockers(m)
    if not why:
        return []
    return [f"model.model_impl=native cannot run this model ({source}: {'; '.join(why)}); "
            "set model.model_impl=transformers or auto"]


def check_checkpoint(m: ModelConfig) -> list[str]:
    """model.hf_checkpoint holds a config.json (for a trainer that loads it through transformers)."""
    if not m.hf_checkpoint or (Path(m.hf_checkpoint) / "config.json").is_file():
        return []
    return [Missing(f"model.hf_checkpoint={m.hf_checkpoint}: config.json not found; point model.hf_checkpoint at a "
                    "Hugging Face model directory (a random one: python -m slime_hydra.models.random_checkpoint "
                    f"{m.hf_checkpoint} model=<option>)", "model.hf_checkpoint", m.hf_checkpoint)]


def floor_hint(key: str, t: TrainConfig) -> str:
    """The schedule's floor must come down with the rate (train.min_lr <= train.lr), or the fix is refused in turn."""
    if key != "train.lr" or t.lr_decay_style == "constant" or t.min_lr <= SAFE_RL_LR:
        return ""
    return f", with train.min_lr=0 (slime's default; now {t.min_lr:g}, above the new rate)"


def check_learning_rate(m: ModelConfig, t: TrainConfig, load: Optional[str]) -> tuple[list[str], list[str]]:
    """(problems, notes) of train.lr and train.critic_lr against the model's size; `load` is the run's load=."""
    problems: list[str] = []
    notes: list[str] = []
    params, source = model_size(m)
    if params < REAL_SIZE or t.allow_unsafe_lr:
        return problems, notes
    keys = [("train.lr", t.lr)]
    if t.critic_lr is not None:  # set: checked whether or not the estimator has a critic (this check does not see which)
        keys.append(("train.critic_lr", t.critic_lr))
    trained = "model.hf_checkpoint" if m.hf_checkpoint else ("load" if load else None)
    for key, lr in keys:
        if lr <= MAX_RL_LR:
            continue
        why = (f"{key}={lr:g} is too high for RL of a {params / 1e6:,.0f}M-parameter model ({source}; the rule applies "
               f"from {REAL_SIZE / 1e6:.0f}M): above {MAX_RL_LR:g} a few steps can wreck what a trained model knows; set "
               f"{key}={SAFE_RL_LR:g} (slime's and verl's default) or at most {MAX_RL_LR:g}{floor_hint(key, t)}, or "
               "train.allow_unsafe_lr=true to run it anyway")
        if trained:
            problems.append(why + f" (refused: the weights come from {trained})")
        else:
            notes.append("warning: " + why)
    return problems, notes
