"""Builds (model, tokenizer) from a ModelConfig: a real HF checkpoint, or a fresh tiny model.

A fresh model is a transformers class built from a config derived from the schema's
Megatron-style fields, so the same names describe a 1M-parameter CPU model and Qwen3-4B.
"""

from __future__ import annotations

import torch

from slime_hydra.config.schema import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def hf_config_kwargs(model: ModelConfig, vocab_size: int, pad_id: int, eos_id: int) -> dict:
    """Schema fields -> transformers Qwen3/Llama config kwargs (Qwen3-MoE: its experts too)."""
    moe = {} if not (model.num_experts and model.architecture == "qwen3_moe") else dict(
        num_experts=model.num_experts, num_experts_per_tok=model.moe_router_topk, moe_intermediate_size=model.moe_ffn_hidden_size,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=model.moe_aux_loss_coeff)
    return moe | dict(
        vocab_size=vocab_size,
        hidden_size=model.hidden_size,
        intermediate_size=model.ffn_hidden_size,
        num_hidden_layers=model.num_layers,
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_query_groups,
        head_dim=model.kv_channels,
        rope_theta=model.rotary_base,
        rms_norm_eps=model.norm_epsilon,
        max_position_embeddings=model.max_position_embeddings,
        tie_word_embeddings=not model.untie_embeddings_and_output_weights,
        initializer_range=model.init_std,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
    )


def build_tokenizer(model: ModelConfig):
    if model.hf_checkpoint:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model.hf_checkpoint)
        tok.padding_side = "left"
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        return tok
    from slime_hydra.models.tokenizer import build_char_tokenizer

    return build_char_tokenizer(tools=model.tokenizer == "char_tools")


def build_model(model: ModelConfig, tokenizer, seed: int) -> torch.nn.Module:
    dtype = DTYPES[model.dtype]
    if model.hf_checkpoint:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(model.hf_checkpoint, dtype=dtype,
                                                    attn_implementation=model.attn_implementation)
    from transformers import AutoConfig, AutoModelForCausalLM

    vocab = model.vocab_size or len(tokenizer)
    config = AutoConfig.for_model(
        model.architecture, **hf_config_kwargs(model, vocab, tokenizer.pad_token_id, tokenizer.eos_token_id)
    )
    config._attn_implementation = model.attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # what save_pretrained would write: a config saved on its own (megatron's save_hf, the engines' start under Ray)
    # must name the class for SGLang / transformers to load it
    net.config.architectures = [type(net).__name__]
    return net
