"""TransformerConfig + layer spec + GPTModel from the typed model / parallelism groups.

The layer spec is megatron's local (Transformer-Engine-free) spec with the core attention
replaced by torch's fused scaled_dot_product_attention (flash / cuDNN / memory-efficient kernels
on Hopper; the math kernel on CPU) instead of megatron's unfused baddbmm + softmax. Sequences are
right-padded and attention is causal, so real tokens never attend to padding and no mask tensor
is needed; packed samples (train.qkv_format=thd, PackedSeqParams) run torch's varlen kernel on the GPU (one SDPA
call each elsewhere), and megatron's THD rotary is replaced by one without host syncs (_thd_rope).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import parallel_state as ps
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

from slime_hydra.config.schema import ModelConfig, ParallelismConfig
from slime_hydra.models.hf_check import moe_layer_pattern
from slime_hydra.training.thd import causal_loop_attention, causal_varlen_attention, varlen_usable

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class SDPAttention(DotProductAttention):
    """Core attention through F.scaled_dot_product_attention; [s, b, heads, dim] in, [s, b, hidden] out.

    Grouped-query attention: SDPA broadcasts the key/value groups itself (enable_gqa, torch >= 2.5) rather
    than a repeat_interleave copy per head: the same numbers (bit-equal on CPU, tests/training/megatron/test_backend.py; on
    the H200: benchmarks/bench_megatron.py --parts parity) and no [b, heads, s, dim] copies of k and v."""

    def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
        # MLA passes its q/k and v head dims (multi_latent_attention.py); megatron's own local
        # DotProductAttention takes neither, so the local spec cannot build MLA without this class.
        # SDPA reads the head dims from the tensors.
        super().__init__(*args, **kwargs)

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        assert attention_bias is None, "SDPAttention takes no bias"
        if packed_seq_params is not None:
            return self._thd(query, key, value, packed_seq_params)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, dim]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                             dropout_p=self.config.attention_dropout if self.training else 0.0,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)  # [s, b, heads*dim]

    def _thd(self, query, key, value, packed_seq_params):
        """Packed samples (train.qkv_format=thd): [t, heads, dim] in (megatron squeezed the batch of 1), [t, heads*dim]
        out; causal attention within each sample of cu_seqlens: torch's varlen flash kernel on the GPU (one launch, no
        host sync: it runs inside torch.compile'd layers), else one SDPA call per sample (training/thd.py; megatron's
        own varlen kernel is Transformer Engine's)."""
        assert packed_seq_params.qkv_format == "thd", packed_seq_params.qkv_format
        p = packed_seq_params
        dropout = self.config.attention_dropout if self.training else 0.0
        if varlen_usable(query, self.softmax_scale, dropout, p.max_seqlen_q):
            out = causal_varlen_attention(query, key, value, p.cu_seqlens_q, p.max_seqlen_q, self.softmax_scale)
        else:
            out = causal_loop_attention(query, key, value, p.cu_seqlens_q, self.softmax_scale, dropout)
        return out.reshape(out.shape[0], -1)


class TorchNorm:
    """torch's LayerNorm / RMSNorm as megatron's WrappedTorchNorm builds them, with sequence parallelism.

    With parallelism.sequence_parallel each TP rank norms its own slice of the sequence, so a norm weight's gradient
    on one rank is a partial sum; its parameters are marked `sequence_parallel`, and megatron's finalize_model_grads
    adds such gradients over the TP group (as it does for Transformer Engine's norms). WrappedTorchNorm refuses
    sequence parallelism outright. Every norm of the model is this one (`local_norms`)."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **unused):
        if config.layernorm_zero_centered_gamma:
            raise ValueError("layernorm_zero_centered_gamma is not supported by torch's norms")
        kinds = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}
        if config.normalization not in kinds:
            raise ValueError(f"normalization={config.normalization!r}: torch's norms are {sorted(kinds)}")
        norm = kinds[config.normalization](normalized_shape=hidden_size, eps=eps)
        if config.sequence_parallel:
            for p in norm.parameters():
                p.sequence_parallel = True
        return norm


def local_norms(spec):
    """`spec` (a layer's ModuleSpec, its submodules, recursively) with every WrappedTorchNorm replaced by TorchNorm."""
    import dataclasses

    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    if spec is WrappedTorchNorm:
        return TorchNorm
    if isinstance(spec, ModuleSpec):
        spec.module = local_norms(spec.module)
        spec.submodules = local_norms(spec.submodules)
    elif dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        for f in dataclasses.fields(spec):
            setattr(spec, f.name, local_norms(getattr(spec, f.name)))
    return spec


def _norm(config: TransformerConfig):
    return TorchNorm(config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon)


class _PostNorm:
    """glm4: the output of the module it is mixed into is normed before the residual add; NORM names the norm (the
    checkpoint's name, convert.py maps it)."""

    NORM: str

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        setattr(self, self.NORM, _norm(config))

    def forward(self, *args, **kwargs):
        out, bias = super().forward(*args, **kwargs)
        return getattr(self, self.NORM)(out), bias


class PostNormSelfAttention(_PostNorm, SelfAttention):
    """glm4: attention whose output is normed before the residual add (post_self_attn_layernorm)."""

    NORM = "post_self_attn_layernorm"


class PostNormMLP(_PostNorm, MLP):
    """glm4: an MLP whose output is normed before the residual add (post_mlp_layernorm)."""

    NORM = "post_mlp_layernorm"


def padded_vocab_size(vocab: int, tp: int, multiple: int = 128) -> int:
    """megatron's make-vocab-size-divisible-by: a multiple of `multiple` × TP (rows past `vocab` are masked)."""
    m = multiple * tp if vocab >= multiple * tp else tp
    return -(-vocab // m) * m


def transformer_config(m: ModelConfig, p: ParallelismConfig) -> TransformerConfig:
    dtype = DTYPES[m.dtype]
    granularity = p.recompute_granularity or ("selective" if p.recompute_activations else None)
    kw = dict(
        num_layers=m.num_layers, hidden_size=m.hidden_size, ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups, kv_channels=m.kv_channels,
        normalization=m.normalization, layernorm_epsilon=m.norm_epsilon, gated_linear_unit=m.swiglu,
        activation_func=F.silu if m.swiglu else F.gelu, add_bias_linear=False, add_qkv_bias=m.add_qkv_bias,
        qk_layernorm=m.qk_layernorm, rotary_interleaved=m.rotary_interleaved, hidden_dropout=0.0, attention_dropout=0.0,
        init_method_std=m.init_std,
        tensor_model_parallel_size=p.tensor_model_parallel_size, pipeline_model_parallel_size=p.pipeline_model_parallel_size,
        context_parallel_size=p.context_parallel_size, expert_model_parallel_size=p.expert_model_parallel_size,
        expert_tensor_parallel_size=p.expert_tensor_parallel_size or p.tensor_model_parallel_size,
        sequence_parallel=p.sequence_parallel, params_dtype=dtype, pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        recompute_granularity=granularity, recompute_method=p.recompute_method, recompute_num_layers=p.recompute_num_layers,
        recompute_modules=list(p.recompute_modules) if p.recompute_modules is not None else None,
        # each micro-batch's loss is already divided by its step's denominator: sum, never average
        calculate_per_token_loss=True, variable_seq_lengths=True,
        # fused kernels of Apex / TE are absent: the plain torch paths
        bias_activation_fusion=False, masked_softmax_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False,
        moe_token_dispatcher_type="alltoall",  # dense: unused, but allgather refuses variable_seq_lengths
    )
    if m.num_experts:
        kw |= dict(num_moe_experts=m.num_experts, moe_ffn_hidden_size=m.moe_ffn_hidden_size, moe_router_topk=m.moe_router_topk,
                   moe_layer_freq=moe_layer_pattern(m.moe_layer_freq, m.num_layers),
                   moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
                   moe_router_score_function=m.moe_router_score_function, moe_router_pre_softmax=m.moe_router_pre_softmax,
                   moe_router_enable_expert_bias=m.moe_router_enable_expert_bias, moe_router_num_groups=m.moe_router_num_groups,
                   moe_router_group_topk=m.moe_router_group_topk, moe_router_topk_scaling_factor=m.moe_router_topk_scaling_factor,
                   moe_router_load_balancing_type=m.moe_router_load_balancing_type, moe_aux_loss_coeff=m.moe_aux_loss_coeff,
                   moe_grouped_gemm=m.moe_grouped_gemm, moe_token_dispatcher_type=m.moe_token_dispatcher_type,
                   moe_router_dtype=m.moe_router_dtype)
    if m.multi_latent_attention:
        return MLATransformerConfig(**kw, q_lora_rank=m.q_lora_rank, kv_lora_rank=m.kv_lora_rank, qk_head_dim=m.qk_head_dim,
                                    qk_pos_emb_head_dim=m.qk_pos_emb_head_dim, v_head_dim=m.v_head_dim, rotary_base=m.rotary_base,
                                    rotary_scaling_factor=m.rotary_scaling_factor, mscale=m.mscale, mscale_all_dim=m.mscale_all_dim,
                                    rope_type="yarn")  # original_max_position_embeddings: megatron's 4096 (deepseek-v3, kimi-k2)
    return TransformerConfig(**kw)


def _without_te() -> None:
    """Two megatron-core 0.16.1 bugs when Transformer Engine is absent (as here, CPU and GPU alike):
    - its extensions module imports with placeholder (non-class) TELinear, so multi_latent_attention.py
      sets HAVE_TE=True and then fails on `isinstance(self.linear_proj, TELinear)` (line 185) when
      building any MLA layer: HAVE_TE=False is the truth;
    - moe/moe_utils.py's RouterGatingLinearFunction.forward (line 1192) reads `te_general_gemm`, which is
      defined only when TE imports: every MoE router forward raises NameError. None selects the torch matmul."""
    from megatron.core.transformer import multi_latent_attention as mla
    from megatron.core.transformer.moe import moe_utils

    if not isinstance(mla.TELinear, type):
        mla.HAVE_TE = False
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _thd_rope(t, cu_seqlens, freqs, rotary_interleaved=False, multi_latent_attention=False, mscale=1.0, cp_group=None):
    """megatron-core 0.16.1's unfused THD rotary (rope_utils._apply_rotary_pos_emb_thd) without its host syncs: it reads
    cu_seqlens with .tolist() and branches on a tensor, which inside a torch.compile'd layer breaks the graph twice per
    call and recompiles for each new number of samples. The same rows of freqs, gathered on the device: token j of
    sample i gets freqs[j] (freqs over the longest sample), or freqs[cu_seqlens[i] + j] when freqs covers the whole
    stream (megatron's exact-mapping case); the same _apply_rotary_pos_emb_bshd on them, so the same numbers.
    Context parallelism keeps megatron's own."""
    if cp_group is not None and cp_group.size() > 1:
        return _MEGATRON_THD_ROPE(t, cu_seqlens, freqs, rotary_interleaved=rotary_interleaved,
                                  multi_latent_attention=multi_latent_attention, mscale=mscale, cp_group=cp_group)
    idx = torch.arange(t.shape[0], device=t.device)  # [t]
    cu = cu_seqlens.long()
    start = cu[torch.searchsorted(cu, idx, right=True) - 1]  # [t] the first token of each token's sample
    pos = torch.where(cu[-1] == freqs.shape[0], idx, idx - start)
    return rope_utils._apply_rotary_pos_emb_bshd(t.unsqueeze(1), freqs[pos], rotary_interleaved=rotary_interleaved,
                                                 multi_latent_attention=multi_latent_attention, mscale=mscale).squeeze(1)


_MEGATRON_THD_ROPE = rope_utils._apply_rotary_pos_emb_thd


def layer_spec(m: ModelConfig, config: TransformerConfig, sdpa: bool = True):
    """The local spec of this stage's layers and the final norm (TransformerBlockSubmodules): dense, or per-layer specs
    following model.moe_layer_freq (MoE); every norm a TorchNorm."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

    if m.multi_latent_attention or m.num_experts:
        _without_te()
    rope_utils._apply_rotary_pos_emb_thd = _thd_rope  # read at each call by rope_utils.apply_rotary_pos_emb
    if m.num_experts:  # dense and MoE layers interleaved (e.g. deepseek-v3's first 3 dense layers)
        block = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=m.normalization)
        specs = block.layer_specs
    else:
        one = get_gpt_layer_local_spec(qk_layernorm=m.qk_layernorm, multi_latent_attention=m.multi_latent_attention,
                                       normalization=m.normalization)
        block = TransformerBlockSubmodules(layer_specs=[one] * get_num_layers_to_build(config), layer_norm=TorchNorm)
        specs = [one]  # the same spec object for every layer
    for spec in specs:
        if sdpa:
            spec.submodules.self_attention.submodules.core_attention = SDPAttention
        if m.post_self_attn_layernorm:  # glm4 (both post norms come together: convert.check_convertible)
            spec.submodules.self_attention.module = PostNormSelfAttention
            spec.submodules.mlp.module = PostNormMLP
        local_norms(spec)
    block.layer_norm = TorchNorm
    return block


def cast_parameters(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Every parameter in `dtype`, as megatron's Float16Module (module.bfloat16()) leaves a bf16/fp16 model.

    The local spec's norms (TorchNorm: torch.nn.RMSNorm / LayerNorm) are built in torch's default float32
    whatever params_dtype says; left so, they are the fp32 params that Float16OptimizerWithFloat16Params keeps
    outside its float16 groups, and its sharded_state_dict (0.16.1, optimizer.py:812) maps only those groups:
    a checkpoint save fails with `Param id N does not match any model sharded param`. Buffers stay as built:
    the MoE router's token counts and expert bias are float32 on purpose (router.py keeps expert_bias so)."""
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
    return module


def build_gpt(m: ModelConfig, config: TransformerConfig, vocab_size: int, sdpa: bool = True) -> GPTModel:
    """This rank's pipeline stage of the model, every parameter in config.params_dtype (weights randomly initialised;
    convert.hf_to_megatron fills them)."""
    return cast_parameters(GPTModel(
        config=config, transformer_layer_spec=layer_spec(m, config, sdpa),
        vocab_size=padded_vocab_size(vocab_size, ps.get_tensor_model_parallel_world_size()),
        max_sequence_length=m.max_position_embeddings,
        pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
        position_embedding_type="rope",  # MLA layers build their own yarn rotary from MLATransformerConfig
        rotary_percent=m.rotary_percent, rotary_base=int(m.rotary_base),
        rope_scaling=m.use_rope_scaling, rope_scaling_factor=m.rotary_scaling_factor,
    ), config.params_dtype)
