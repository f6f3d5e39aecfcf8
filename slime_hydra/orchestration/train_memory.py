"""A train rank's GPU memory, worked out from the config: parameters, state, activations, the log-prob pass.

Every figure is bytes on one rank (the most loaded pipeline stage). Worked example throughout: Qwen3-4B on one GPU,
megatron, bf16, train.megatron.grad_reduce_in_fp32=false, compile_layers and compile_log_probs, micro-batches of
4 × 2049 = 8196 tokens (the H200 benchmark of docs/gpu_results.md, which measured a 98.2 GiB peak).

Parameters P: TP splits the linear layers and megatron's padded vocabulary (a multiple of 128 × TP), PP the layers
(the embedding on the first stage, the output layer on the last, and with tied embeddings and PP > 1 a copy there
too), EP the routed experts; norms and routers stay whole. 4B: 36 layers × 100,930,816 + 151,936 × 2,560 (tied) +
2,560 = 4,022,468,096.

State, megatron: weights in model.dtype (a = 2 bytes for bf16), the DDP gradient buffer (4 bytes with
grad_reduce_in_fp32, else a), fp32 main parameters (4; none for an fp32 model) and Adam's two fp32 moments (8); the
distributed optimizer splits the last two over the data-parallel ranks (expert parameters over the expert
data-parallel ranks). 4B: (2 + 2 + 4 + 8) × P = 64,359,489,536 B = 59.94 GiB. torch: weights, gradients and both
AdamW moments in the weights' dtype (4a), on every rank. A reference model (algorithm.use_kl_loss or kl_coef) adds its
weights; a critic (ppo) its own state on the policy's body with a value head. `built` (before the first step, when
the engines start): megatron's weights, gradient buffer and main parameters (Adam's moments come at the first
step); torch's weights.

Activations of one micro-batch of S tokens (train.max_tokens_per_gpu with dynamic batching, else micro_batch_size ×
the longest sample; / CP), per layer and token, as megatron's local layers keep them for the backward pass
(h hidden, f ffn, n heads, g query groups, d head dim, t TP; 4B values):
  the two RMSNorms' inputs and outputs (each output is the next linear's input), 1/rms    4a·h + 8        20,488
  the fused qkv output (the q/k norms and SDPA keep views of it)                          a·(n + 2g)·d/t  12,288
  q and k after the rotary embedding                                                      a·(n + g)·d/t   10,240
  the attention output and its reshaped copy (the output projection's input)              2a·n·d/t        16,384
  SDPA's log-sum-exp and the q/k norms' 1/rms (fp32)                                      4·(2n + g)/t       288
  fc1's output (gate and up), silu(gate), fc2's input                                     4a·f/t          77,824
In all 137,512 bytes; train.megatron.compile_layers: Inductor recomputes silu(gate) in the backward pass (a·f/t less):
118,056. 4B: 36 × 8196 × 118,056 = 34,833,131,136 B = 32.44 GiB. Full recompute keeps each block's input (a·h) and
one block's activations; selective recompute of core_attn drops the attention output and log-sum-exp, of mlp the
MLP's. With PP the first stage holds PP micro-batches at once (1F1B). A routed MoE token keeps its top-k experts'
MLPs, its dispatched copies in and out and the router's fp32 logits. The torch trainer's Hugging Face RMSNorms also
keep fp32 copies: 4·(2h + (n + g)·d/t) more.

The log-prob pass on the last stage: the final norm (2a·h per token), the logits and their gradient in model.dtype
(2a·V/t per token, V padded), and the fp32 temporaries of one chunk of train.megatron.log_probs_chunk_size tokens (one
[chunk, V/t] tensor with compile_log_probs, four eager). 4B: 8196 × 617,984 + 4 × 1024 × 151,936 = 5.30 GiB. The torch
trainer takes fp32 log-softmax over all of [S, V]: bf16 logits, the fp32 upcast, its scaled copy, log-softmax and its
gradient, (a + 16)·V per token. A forward-only pass (old or reference log-probs, values) at
train.log_probs_max_tokens_per_gpu keeps half of it (no gradient).

Peak = state + the larger of (PP micro-batches in flight, one micro-batch and the log-prob pass, a forward-only pass)
(+ one fp32 copy of the optimizer's share with train.adam_impl=foreach). 4B: 59.94 + 32.44 + 5.30 = 97.68 GiB against
98.2 measured; the 0.6B shape at 16,392 tokens: 39.88 planned, 39.8 measured; the 4B at 4098 tokens: 79.10, 79.5.
Staging: the engines' copy of the weights the ranks keep between syncs (megatron: TP-gathered Hugging Face tensors
with TP > 1, the gate and up halves cut out of fc1 with TP = 1; the torch trainer's are its parameters).
Left out: allocator fragmentation, NCCL buffers, MLA counted as the standard attention of its heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from slime_hydra.config.schema import ModelConfig, ParallelismConfig, TrainConfig

GIB = 1 << 30
CONTEXT_GIB = 0.5  # one CUDA context (torch or SGLang process), outside torch's allocator
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def gib(n: float) -> float:
    return n / GIB


def padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """megatron's make-vocab-size-divisible-by (training/megatron/model.py padded_vocab_size, without megatron)."""
    m = multiple * tp if vocab >= multiple * tp else tp
    return -(-vocab // m) * m


# -- parameters ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """The train ranks' parallel sizes (megatron's; the torch trainer: world data-parallel ranks, the rest 1)."""

    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    etp: int = 0  # the routed experts' tensor-parallel size; 0: tp (megatron's default)

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def dp(self) -> int:
        """Dense parameters' optimizer shards (megatron's data-parallel group with CP)."""
        return max(self.world // (self.tp * self.pp), 1)

    @property
    def expert_dp(self) -> int:
        """Expert parameters' optimizer shards: the ranks holding the same experts."""
        return max(self.world // (self.pp * self.ep * self.expert_tp), 1)

    @staticmethod
    def of(p: ParallelismConfig, world: int, megatron: bool) -> "Layout":
        if not megatron:
            return Layout(world)
        return Layout(world, p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size,
                      p.expert_model_parallel_size, p.sequence_parallel, p.use_distributed_optimizer,
                      p.expert_tensor_parallel_size or 0)


def moe_pattern(m: ModelConfig) -> list[int]:
    """1 per MoE layer (models/size.num_parameters' reading of model.moe_layer_freq)."""
    if not m.num_experts:
        return [0] * m.num_layers
    freq = m.moe_layer_freq
    if isinstance(freq, int) and freq > 0:
        return [int(i % freq == 0) for i in range(m.num_layers)]
    if isinstance(freq, (list, tuple)):
        return [int(x) for x in freq]
    return [1] * m.num_layers  # a megatron expression string: counted as all MoE (an upper bound)


def attention_params(m: ModelConfig) -> tuple[int, int]:
    """(split by TP, whole on every TP rank) of one layer's attention and norms."""
    h, n, g, d = m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * n * qk) if m.q_lora_rank else h * n * qk
        split = q + h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank \
            + m.kv_lora_rank * n * (m.qk_head_dim + m.v_head_dim) + n * m.v_head_dim * h
        return split, h * (2 + m.post_self_attn_layernorm + m.post_mlp_layernorm)
    split = h * (n + 2 * g) * d + n * d * h + ((n + 2 * g) * d if m.add_qkv_bias else 0)
    whole = (2 * d if m.qk_layernorm else 0) + h * (2 + m.post_self_attn_layernorm + m.post_mlp_layernorm)
    return split, whole


@dataclass(frozen=True)
class RankParams:
    """Parameters one train rank holds (the most loaded pipeline stage), by how the optimizer shards them."""

    dense: int  # split by TP (or whole), sharded over `dp` by the distributed optimizer
    expert: int  # this rank's experts, sharded over `expert_dp`

    @property
    def total(self) -> int:
        return self.dense + self.expert


def rank_params(m: ModelConfig, lay: Layout, vocab: int, head: Optional[int] = None, pad: bool = True) -> RankParams:
    """`head`: a value head's rows (a critic: 1, whole on every TP rank) instead of the output layer; `pad`: the
    vocabulary padded as megatron pads it (an SGLang engine's is not)."""
    h, mats = m.hidden_size, 3 if m.swiglu else 2
    split, whole = attention_params(m)
    v_pad = padded_vocab(vocab, lay.tp) if pad else vocab
    pattern = moe_pattern(m)
    per_stage = -(-m.num_layers // lay.pp)
    stages = []
    for s in range(lay.pp):
        layers = pattern[s * per_stage:(s + 1) * per_stage]
        dense = sum(split // lay.tp + whole + (mats * h * m.ffn_hidden_size // lay.tp if not moe else
                    h * m.num_experts + mats * h * (m.moe_shared_expert_intermediate_size or 0) // lay.tp)
                    for moe in layers)
        expert = sum(moe for moe in layers) * (m.num_experts or 0) // lay.ep * mats * h * (m.moe_ffn_hidden_size or 0) // lay.expert_tp
        first, last = s == 0, s == lay.pp - 1
        dense += v_pad * h // lay.tp if first else 0  # the word embedding
        if last:
            dense += h  # the final norm
            if head is not None:
                dense += head * h + head  # a value head (weight and bias), whole on every TP rank
            elif m.untie_embeddings_and_output_weights or lay.pp > 1:  # tied with PP > 1: the last stage keeps a copy
                dense += v_pad * h // lay.tp
        stages.append(RankParams(dense, expert))
    return max(stages, key=lambda r: r.total)


# -- the trainer -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainMemory:
    """Bytes on one train rank. `built`: what it holds once constructed (before its first optimizer step)."""

    params: int
    weights: int
    grads: int
    main_params: int
    optimizer: int
    reference: int
    critic: int
    built: int  # before the first step: megatron's weights, gradient buffer and main parameters; torch's weights
    activations: int  # one micro-batch on the most loaded stage
    in_flight: int  # micro-batches whose activations the first pipeline stage holds at once (1F1B: PP)
    logprob_pass: int
    forward_pass: int  # a forward-only pass (old / reference log-probs, values) at train.log_probs_max_tokens_per_gpu
    optimizer_temps: int
    staging: int  # the engines' copy of the weights kept between syncs (megatron's TP-gathered / concatenated HF tensors)
    bucket: int  # one weight-sync bucket, while a sync runs
    tokens: int  # per micro-batch, what the activations assume
    per_token_layer: int  # activation bytes per token and layer (no recompute)

    @property
    def state(self) -> int:
        return self.weights + self.grads + self.main_params + self.optimizer + self.reference + self.critic

    @property
    def peak(self) -> int:
        """The first stage's in-flight micro-batches, or the last stage's one and its log-prob pass (PP=1: both)."""
        step = max(self.in_flight * self.activations, self.activations + self.logprob_pass, self.forward_pass)
        return self.state + step + self.optimizer_temps


def state_bytes(r: RankParams, lay: Layout, dtype: str, megatron: bool, grad_fp32: bool) -> tuple[int, int, int, int]:
    """(weights, gradients, fp32 main parameters, Adam moments) of one model's parameters `r` on one rank."""
    a = DTYPE_BYTES[dtype]
    if not megatron:  # torch: gradients and AdamW's moments in the weights' dtype, nothing sharded
        return a * r.total, a * r.total, 0, 2 * a * r.total
    grads = (4 if grad_fp32 or a == 4 else a) * r.total
    shard = (r.dense // lay.dp + r.expert // lay.expert_dp) if lay.distributed_optimizer else r.total
    return a * r.total, grads, (4 * shard if a < 4 else 0), 8 * shard


def per_token_layer(m: ModelConfig, tp: int, compiled: bool, hf_norms: bool) -> int:
    """Activation bytes one token keeps per dense layer for the backward pass (derivation: the module docstring)."""
    a, h, f = DTYPE_BYTES[m.dtype], m.hidden_size, m.ffn_hidden_size
    n, g, d = m.num_attention_heads, m.num_query_groups, m.kv_channels
    norms = 4 * a * h + 2 * 4
    attention = a * (n + 2 * g) * d // tp + a * (n + g) * d // tp + 2 * a * n * d // tp + 4 * (2 * n + g) // tp
    mlp = (2 * a * f + a * f + a * f) // tp - (a * f // tp if compiled else 0)
    if m.num_experts:  # a routed token: its top-k experts' MLPs, its dispatched copies in and out, the router's fp32 logits
        e_mlp = 4 * a * (m.moe_ffn_hidden_size or 0) // tp - (a * (m.moe_ffn_hidden_size or 0) // tp if compiled else 0)
        mlp = m.moe_router_topk * (e_mlp + 2 * a * h) + 4 * m.num_experts \
            + 4 * a * (m.moe_shared_expert_intermediate_size or 0) // tp
    extra = 4 * (2 * h + (n + g) * d) // tp if hf_norms else 0
    return norms + attention + mlp + extra


def layer_activations(m: ModelConfig, p: ParallelismConfig, per_layer: int, layers: int, tokens: int) -> int:
    """Activation bytes of `layers` layers for one micro-batch of `tokens`, under parallelism's recompute settings."""
    a, h = DTYPE_BYTES[m.dtype], m.hidden_size
    granularity = p.recompute_granularity or ("selective" if p.recompute_activations else None)
    if granularity == "full":
        k = max(p.recompute_num_layers or 1, 1)
        if p.recompute_method == "block":  # the first k layers keep only their input
            return tokens * (min(k, layers) * a * h + max(layers - k, 0) * per_layer + (per_layer if k else 0))
        return tokens * (math.ceil(layers / k) * a * h + min(k, layers) * per_layer)  # uniform: blocks of k layers
    if granularity == "selective":
        modules = p.recompute_modules or ["core_attn"]
        saved = per_layer
        if "core_attn" in modules:  # the attention output and the log-sum-exp are recomputed
            saved -= a * m.num_attention_heads * m.kv_channels // p.tensor_model_parallel_size + \
                4 * m.num_attention_heads // p.tensor_model_parallel_size
        if "mlp" in modules:  # the MLP keeps only its input
            saved -= 4 * a * m.ffn_hidden_size // p.tensor_model_parallel_size
        return tokens * layers * saved
    return tokens * layers * per_layer


def micro_batch_tokens(t: TrainConfig, max_seq: int, per_rank_samples: int) -> int:
    """Tokens of the largest micro-batch: the token budget (a sample longer than it runs alone), else
    micro_batch_size samples (None: the rank's whole step) of the longest length."""
    if t.use_dynamic_batch_size and t.max_tokens_per_gpu:
        return max(t.max_tokens_per_gpu, max_seq)
    return (t.micro_batch_size or per_rank_samples) * max_seq


def logprob_pass(m: ModelConfig, t: TrainConfig, vocab: int, tp: int, tokens: int, megatron: bool) -> int:
    """The last stage's final norm, logits and log-prob temporaries for one micro-batch (module docstring)."""
    a, h = DTYPE_BYTES[m.dtype], m.hidden_size
    if not megatron:  # bf16 logits, the fp32 upcast, its scaled copy, log-softmax and its gradient over [S, V]
        return tokens * (2 * a * h + (a + 16) * vocab)
    v = padded_vocab(vocab, tp) // tp
    chunk = tokens if t.megatron.log_probs_chunk_size < 1 else min(t.megatron.log_probs_chunk_size, tokens)
    return tokens * (2 * a * h + 2 * a * v) + (1 if t.megatron.compile_log_probs else 4) * 4 * chunk * v


@dataclass(frozen=True)
class TrainInputs:
    """What the trainer's figures read beside the model, parallelism and train groups (the composition fills it)."""

    world: int  # train ranks
    vocab: int
    max_seq: int  # the longest sample: prompt + response tokens
    step_samples: int  # train.global_batch_size
    keep_reference: bool
    critic: bool
    megatron: bool
    sync_bucket: int  # rollout.update_weight_buffer_size (0: no engine to sync)


def train_memory(m: ModelConfig, p: ParallelismConfig, t: TrainConfig, x: TrainInputs) -> TrainMemory:
    lay = Layout.of(p, x.world, x.megatron)
    mg = t.megatron
    r = rank_params(m, lay, x.vocab) if x.megatron else rank_params(m, lay, x.vocab, pad=False)
    weights, grads, main, adam = state_bytes(r, lay, m.dtype, x.megatron, mg.grad_reduce_in_fp32)
    a = DTYPE_BYTES[m.dtype]
    reference = a * r.total if x.keep_reference else 0
    critic = built_critic = 0
    if x.critic:  # the policy's body with a value head, its own gradients and optimizer
        body = rank_params(replace(m, untie_embeddings_and_output_weights=True), lay, x.vocab, head=1, pad=x.megatron)
        cw, cg, cm, ca = state_bytes(body, lay, m.dtype, x.megatron, mg.grad_reduce_in_fp32)
        critic, built_critic = cw + cg + cm + ca, (cw + cg + cm if x.megatron else cw)
    built = (weights + grads + main if x.megatron else weights) + built_critic
    tokens = micro_batch_tokens(t, x.max_seq, max(x.step_samples // lay.dp, 1)) // lay.cp
    per_layer = per_token_layer(m, lay.tp, x.megatron and mg.compile_layers, hf_norms=not x.megatron)
    stage_layers = -(-m.num_layers // lay.pp)
    act = layer_activations(m, p, per_layer, stage_layers, tokens) if x.megatron else tokens * m.num_layers * per_layer
    logits = logprob_pass(m, t, x.vocab, lay.tp, tokens, x.megatron)
    fwd_tokens = t.log_probs_max_tokens_per_gpu if t.use_dynamic_batch_size and t.log_probs_max_tokens_per_gpu else tokens
    forward = logprob_pass(m, t, x.vocab, lay.tp, max(fwd_tokens, x.max_seq) // lay.cp, x.megatron) // 2  # no gradient
    temps = 4 * (adam // 8) if t.adam_impl == "foreach" else 0  # one fp32 copy of the optimizer's share
    staging = 0
    if x.sync_bucket and x.megatron:  # the torch trainer's HF tensors are its parameters: nothing staged
        hf = rank_params(m, Layout(1), x.vocab, pad=False).total * a
        fc1 = 2 * m.hidden_size * m.ffn_hidden_size * stage_layers * a  # TP=1: gate and up cut out of the fused fc1
        staging = hf if lay.tp > 1 else fc1
    return TrainMemory(r.total, weights, grads, main, adam, reference, critic, built, act, lay.pp, logits, forward, temps,
                       staging, x.sync_bucket, tokens, per_layer)
