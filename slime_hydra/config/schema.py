"""Typed schemas: every default of every config key lives here, once.

YAML options under conf/ attach one of these dataclasses (``defaults: [/schema/<group>@_here_]``)
and carry only what differs. Where slime has a setting, its key here has slime's argument name so its users feel at
home (``--rollout-batch-size`` is ``rollout.rollout_batch_size``); a key slime has no flag for is this project's own and
never called slime's. docs/slime_flags.md maps every slime flag to its key here (or says why there is none). The allowed values of enumerated keys are in
``choices.py``; values derived from others are filled in by app/derive.py; checks live in ``checks*.py`` (and, for
what a component reads, beside the component: app/checks.py calls them); this module only declares shapes, types
and defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


@dataclass
class ModelConfig:
    """Architecture (slime's MODEL_ARGS names) and where the weights come from."""

    name: str = "qwen3-tiny"
    # HF directory (config.json + safetensors + tokenizer). None: build a randomly initialised model
    # from the fields below with the project's character tokenizer (the embedded default).
    hf_checkpoint: Optional[str] = None
    # the character tokenizer built when hf_checkpoint is None: char (the embedded default) | char_tools
    # (the same ids plus <tool_call>, </tool_call>, <tool_response>, </tool_response> for agent tasks)
    tokenizer: str = "char"
    architecture: str = "qwen3"  # transformers model family built when hf_checkpoint is None
    num_layers: int = 4
    hidden_size: int = 128
    ffn_hidden_size: int = 384
    num_attention_heads: int = 4
    num_query_groups: int = 2
    kv_channels: int = 32
    rotary_base: float = 10000.0
    norm_epsilon: float = 1e-6
    max_position_embeddings: int = 256
    untie_embeddings_and_output_weights: bool = False
    qk_layernorm: bool = True
    vocab_size: Optional[int] = None  # None: taken from the tokenizer
    init_std: float = 0.02
    dtype: str = "float32"  # float32 | bfloat16 | float16 | float64 (exactness tests on CPU)
    # transformers attention kernel: sdpa (fused; the GPU default) | eager (plain matmuls: faster for
    # the tiny CPU model's ~12-token sequences)
    attn_implementation: str = "sdpa"
    # whose forward runs the model in the torch trainer and the local rollout (SGLang's --model-impl idea):
    # transformers (the HF modules) | native (models/native.py over the same parameters: packed, padding-free
    # tokens; dense qwen3/llama only; exact to float rounding) | auto (native where it runs, else transformers,
    # resolved before the run: app/derive.py)
    model_impl: str = "transformers"
    # -- read by the megatron backend (slime's MODEL_ARGS; the torch backend builds only dense qwen3/llama) --
    normalization: str = "RMSNorm"  # RMSNorm | LayerNorm
    swiglu: bool = True
    add_qkv_bias: bool = False  # qwen2.5, glm4
    rotary_percent: float = 1.0  # glm4: 0.5
    rotary_interleaved: bool = False  # glm4
    use_rope_scaling: bool = False  # llama3.1's rope scaling, factor rotary_scaling_factor
    rotary_scaling_factor: float = 1.0  # llama3.1: 8; MLA (yarn): deepseek-v3 40, kimi-k2 32
    post_self_attn_layernorm: bool = False  # glm4's extra norms (slime_plugins glm4 spec)
    post_mlp_layernorm: bool = False
    # MoE (num_experts None: dense)
    num_experts: Optional[int] = None
    moe_ffn_hidden_size: Optional[int] = None
    moe_router_topk: int = 2
    # 1: every layer is MoE; megatron's expression "([0]*3+[1]*58)" (0 dense, 1 MoE) or a list
    moe_layer_freq: Any = 1
    moe_shared_expert_intermediate_size: Optional[int] = None
    moe_router_score_function: str = "softmax"  # softmax | sigmoid
    moe_router_pre_softmax: bool = False
    moe_router_enable_expert_bias: bool = False
    moe_router_num_groups: Optional[int] = None
    moe_router_group_topk: Optional[int] = None
    moe_router_topk_scaling_factor: Optional[float] = None
    moe_router_load_balancing_type: str = "aux_loss"  # aux_loss | seq_aux_loss | none
    moe_aux_loss_coeff: float = 0.0
    moe_router_dtype: Optional[str] = "fp32"  # fp32 | fp64 | None (the model dtype: megatron's default)
    moe_grouped_gemm: bool = False
    moe_token_dispatcher_type: str = "allgather"  # allgather | alltoall
    # multi-latent attention (deepseek-v3, moonlight, kimi-k2)
    multi_latent_attention: bool = False
    q_lora_rank: Optional[int] = None  # None: no query compression (moonlight)
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    mscale: float = 1.0
    mscale_all_dim: float = 1.0


@dataclass
class AlgorithmConfig:
    """Advantage estimator and policy loss (slime semantics; docs/algorithms.md has the formulas)."""

    name: str = "grpo"
    advantage_estimator: str = "grpo"  # a row of slime_hydra/algorithms/estimators.py ESTIMATORS
    # policy_loss | sft_loss (the response tokens' NLL, advantages unread) | custom_loss (policy_loss with custom_loss)
    loss_type: str = "policy_loss"
    eps_clip: float = 0.2
    eps_clip_high: Optional[float] = None  # DAPO clip-higher; None means eps_clip
    eps_clip_c: Optional[float] = None  # dual clip lower bound (> 1) for negative advantages
    value_clip: float = 0.2  # ppo: the critic's value-loss clip
    num_critic_only_steps: int = 0  # ppo: the first rollouts train only the critic (slime's --num-critic-only-steps)
    rewards_normalization: bool = True  # subtract the group mean
    grpo_std_normalization: bool = True  # divide by group std + 1e-6 (Dr.GRPO turns this off)
    normalize_advantages: bool = False  # whiten over every response token of the rollout (required by reinforce++)
    kl_coef: float = 0.0  # KL(pi_old || ref) as reward shaping, before advantages (reinforce++ variants)
    gamma: float = 1.0  # discount of reinforce++ returns (and GAE)
    lambd: float = 1.0  # ppo: GAE lambda
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    ref_update_interval: Optional[int] = None  # re-snapshot the KL reference from the policy every N rollouts
    kl_loss_type: str = "low_var_kl"  # k1 | k2 | k3 | low_var_kl
    use_unbiased_kl: bool = False  # KL loss times pi_theta / pi_old (DeepSeek-V3.2)
    entropy_coef: float = 0.0
    # sample_token_mean: mean over samples of each sample's token mean (slime's default)
    # token_mean: mean over every response token of the batch (slime's calculate_per_token_loss)
    # seq_mean_token_sum: mean over samples of each sample's token sum
    # seq_mean_token_sum_norm: same, each sum divided by rollout.rollout_max_response_len (Dr.GRPO)
    loss_aggregation: str = "sample_token_mean"
    use_rollout_logprobs: bool = False  # old log-probs are the rollout engine's, not recomputed
    use_tis: bool = False  # truncated importance sampling: loss *= clamp(exp(old - rollout), tis_clip_low, tis_clip)
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    # {"_target_": "pkg.mod.fn", **kwargs}: fn(rewards [N], mask [N, T], kl [N, T] | None, group_size,
    # **kwargs) -> advantages [N, T]; replaces advantage_estimator's advantages (whitening still applies)
    custom_advantage: dict[str, Any] = field(default_factory=dict)  # empty: none
    # {"_target_": "pkg.mod.fn", **kwargs}: fn(log_probs [n, T], old_log_probs [n, T], advantages [n, T],
    # mask [n, T], **kwargs) -> per-token loss [n, T]; replaces the policy surrogate (TIS, entropy, KL loss
    # and loss_aggregation still apply)
    custom_loss: dict[str, Any] = field(default_factory=dict)  # empty: none
    # slime's --custom-tis-function-path, with use_tis=true: fn(pg_loss [n, T], old_log_probs [n, T],
    # rollout_log_probs [n, T], mask [n, T], **kwargs) -> (pg_loss [n, T], mask [n, T], {name: [n, T]} metrics);
    # replaces the truncated importance weights (tis_clip*). Tokens its mask drops leave the loss's numerator only
    custom_tis_function: dict[str, Any] = field(default_factory=dict)  # empty: none
    # slime's --custom-pg-loss-reducer-function-path: fn(pg_loss [n, T], mask [n, T], denom, **kwargs) -> scalar, the
    # policy-gradient term of one micro-batch (denom: the step's loss_aggregation denominator); the entropy and KL
    # terms and the metrics keep loss_aggregation
    custom_pg_loss_reducer_function: dict[str, Any] = field(default_factory=dict)  # empty: loss_aggregation


@dataclass
class ParallelismConfig:
    """Model parallel layout (read by the megatron backend; the torch backend needs all ones)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    # the routed experts' own tensor-parallel size (EP ranks × this many shard them); None: tensor_model_parallel_size
    expert_tensor_parallel_size: Optional[int] = None
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False  # megatron's ZeRO-1 style sharded optimizer state
    recompute_activations: bool = False  # megatron's shorthand for recompute_granularity=selective
    recompute_granularity: Optional[str] = None  # None | full | selective
    recompute_method: Optional[str] = None  # uniform | block (with recompute_granularity=full)
    recompute_num_layers: Optional[int] = None
    # with recompute_granularity=selective: which submodules (megatron's names: core_attn, mlp, layernorm, moe,
    # shared_experts, mla_up_proj); None: megatron's default [core_attn]
    recompute_modules: Optional[list[str]] = None


@dataclass
class RolloutConfig:
    backend: str = "local"  # local | sglang
    rollout_batch_size: int = 32  # prompts per rollout
    n_samples_per_prompt: int = 8
    rollout_max_response_len: int = 8
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    rollout_top_k: int = -1  # -1: no top-k
    rollout_stop: list[str] = field(default_factory=list)
    rollout_stop_token_ids: list[int] = field(default_factory=list)
    rollout_shuffle: bool = True
    rollout_seed: int = 42
    # -- the data buffer and dynamic sampling (slime_hydra/data/buffer.py has the plug-in contracts) --
    # groups submitted per generation round; rounds repeat until rollout_batch_size groups pass
    # dynamic_sampling_filter. None: rollout_batch_size
    over_sampling_batch_size: Optional[int] = None
    # rounds one rollout may take before the run stops (a filter that drops every group would loop forever);
    # verl's DAPO recipe calls it max_num_gen_batches
    max_dynamic_sampling_rounds: int = 100
    # {"_target_": "pkg.mod.fn", **kwargs}: fn(group: list[Sample], **kwargs) -> bool | (bool, reason);
    # False drops the finished group. Built-in: slime_hydra.data.buffer.check_reward_nonzero_std (DAPO)
    dynamic_sampling_filter: dict[str, Any] = field(default_factory=dict)  # empty: keep every group
    # {"_target_": "pkg.mod.fn", **kwargs}: fn(buffer: list[list[Sample]], num_groups: int, **kwargs) ->
    # the groups to serve (at most num_groups, taken from buffer). Empty: first in, first out
    buffer_filter: dict[str, Any] = field(default_factory=dict)
    # abort what is still generating once enough groups passed; unfinished groups return to the buffer with
    # their partial responses and continue later (otherwise they return as fresh prompts)
    partial_rollout: bool = False
    mask_offpolicy_in_partial_rollout: bool = False  # loss-mask the part generated by older weights
    generation_batch_size: int = 256  # sequences per forward pass in the local backend
    # slime's --custom-generate-function-path as a `_target_` node: async fn(sample, *, generate, tokenizer,
    # sampling, max_turns, **kwargs) -> Sample (slime_hydra/agent/hook.py documents the contract). Empty: the backend's
    # single turn.
    custom_generate: dict[str, Any] = field(default_factory=dict)
    # name -> a `_target_` node of the same contract: the hooks a data row may pick for its samples by name
    # (metadata.custom_generate: "<name>"; verl's agent_name). A row names code only through this registry, filled
    # from the config; a row naming anything else (a dotted path, an unknown name) is a bad row (data.on_bad_row).
    generate_hooks: dict[str, Any] = field(default_factory=dict)
    # slime's --custom-update-weight-post-write-path, with weight_sync=disk: fn(version_dir: str, version: int,
    # **kwargs), called once the weights' files are written and before any engine reads them (publish them on a
    # shared file system)
    custom_update_weight_post_write: dict[str, Any] = field(default_factory=dict)  # empty: none
    max_turns: int = 1  # model turns per sample of a multi-turn generate (slime has no such flag: its agents count their own)
    # -- slime's other rollout hooks, `_target_` nodes (empty: none); engine/rollout_hooks.py has each contract --
    rollout_function: dict[str, Any] = field(default_factory=dict)  # slime --rollout-function-path: replaces the collector
    rollout_sample_filter: dict[str, Any] = field(default_factory=dict)  # --rollout-sample-filter-path: sets remove_sample
    # --rollout-all-samples-process-path: every judged group, dropped ones too
    rollout_all_samples_process: dict[str, Any] = field(default_factory=dict)
    # --custom-convert-samples-to-train-data-path: samples -> TrainBatch
    custom_convert_samples_to_train_data: dict[str, Any] = field(default_factory=dict)
    rollout_data_postprocess: dict[str, Any] = field(default_factory=dict)  # --rollout-data-postprocess-path: the batch before training
    # -- backend=sglang (slime_hydra/rollout/sglang/): engines = cluster.rollout_num_gpus / rollout_num_gpus_per_engine --
    # SGLang ServerArgs pass-through (slime's --sglang-<flag>), e.g. {mem_fraction_static: 0.8, context_length: 8192};
    # checked against sglang's ServerArgs fields. model_path, tp_size, port, host and random_seed are the runner's.
    sglang: dict[str, Any] = field(default_factory=dict)
    sglang_env: dict[str, str] = field(default_factory=dict)  # environment of the engine processes, e.g. {OMP_NUM_THREADS: '1'}
    sglang_router_policy: str = "cache_aware"  # sglang-router --policy: cache_aware | round_robin | random | power_of_two
    sglang_router: dict[str, Any] = field(default_factory=dict)  # RouterArgs pass-through (thresholds, health checks)
    # a sglang-router already running (slime's --sglang-router-ip / --sglang-router-port), both or neither: the run starts
    # no router, registers its engines with this one (each with its own key; the router's key from
    # $SLIME_HYDRA_SGLANG_ROUTER_API_KEY), refuses it if it routes to engines the run does not own, and removes its
    # engines from it at the end. sglang_router_policy and sglang_router are then the router's own, not the run's.
    sglang_router_ip: Optional[str] = None
    sglang_router_port: Optional[int] = None
    sglang_server_concurrency: int = 512  # in-flight requests per engine
    sglang_request_batch_size: int = 1  # samples per /generate request (slime sends one; batching cuts HTTP overhead on CPU)
    sglang_request_timeout_s: float = 600.0
    sglang_max_retries: int = 5  # per request (transport errors, 5xx, stale weights), exponential backoff
    sglang_retry_backoff_s: float = 0.5
    sglang_server_start_timeout_s: float = 600.0
    # slime's --rollout-external-engine-addrs: SGLang servers already running ("host:port" or "http://host:port", one
    # per engine), started with --api-key set to $SLIME_HYDRA_SGLANG_API_KEY. The run starts none, puts its own router
    # in front of them, checks their options against rollout.sglang, syncs the model's weights to them as version 0
    # (checked equal) before the first rollout, and leaves them running; an engine lost mid-run is waited for, not
    # restarted.
    rollout_external_engine_addrs: Optional[list[str]] = None
    weight_sync: str = "auto"  # auto (tensor when colocated, else distributed) | tensor | distributed (gloo/NCCL group) | disk
    update_weight_buffer_size: int = 512 * 1024**2  # bytes per weight-sync bucket (slime's default)
    check_weight_update_equal: bool = False  # after each sync, compare every engine's weights with the trainer's
    use_fault_tolerance: bool = False  # health checks, restart of dead engines, resync, re-dispatch
    rollout_health_check_interval: float = 30.0  # seconds between health checks
    # seconds after a (re)launch before a silent engine counts as failed (slime's 0 kills engines still loading)
    rollout_health_check_first_wait: float = 600.0
    rollout_health_check_max_failures: int = 2  # failed checks in a row before a restart


@dataclass
class DataConfig:
    name: str = "addition"
    # slime format ({"prompt": ..., "label": ...}): a jsonl or parquet file, a glob, a directory of them, or a
    # Hugging Face dataset directory (save_to_disk) / .arrow file, read through `datasets`
    prompt_data: Optional[str] = None
    input_key: str = "prompt"
    label_key: str = "label"
    metadata_key: str = "metadata"
    tool_key: Optional[str] = None  # slime's --tool-key: a row's tool list, passed to the chat template as tools=
    apply_chat_template: bool = False
    # slime's --apply-chat-template-kwargs: what the chat template is given besides the messages (Qwen3's
    # enable_thinking: false, for example); needs apply_chat_template
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # longer prompts (in tokens) are dropped when read, counted in data/overlong_rows. None: the model's context
    # (model.max_position_embeddings, config.json's with model.hf_checkpoint, rollout.sglang.context_length when set)
    # minus rollout.rollout_max_response_len, filled in at validation (an eval set: minus its eval_max_response_len)
    rollout_max_prompt_len: Optional[int] = None
    # a row that fails its checks (encoding, JSON, field types; eval files too): error stops the run with
    # every problem's file:line | skip drops it with a warning, counted in data/skipped_rows
    on_bad_row: str = "error"
    # a jsonl line longer than this (bytes) is a bad row, skipped over without being read whole (data/rows.py)
    max_line_bytes: int = 16 << 20
    # Prompt data at scale (slime has no such flags: it loads the prompt file whole): streaming reads prompt_data lazily
    # (a jsonl/parquet file, a glob, a directory, or a Hugging Face save_to_disk directory) and shuffles it
    # through a buffer of shuffle_buffer_size prompts per epoch; num_workers processes read, check, template
    # and tokenize ahead of the rollout (0: in the driver); a worker silent for worker_timeout_s is an error.
    streaming: bool = False
    # slime's --data-source-path: fn(prompts, tokenizer, n_samples_per_prompt, seed, **kwargs) -> a prompt source
    # (next_groups, metrics, state_dict, load_state_dict: protocols.PromptSource), e.g. a class; serves the rollouts'
    # prompt groups in place of prompt_data's (still loaded for the warm start), its state_dict saved in every checkpoint
    data_source: dict[str, Any] = field(default_factory=dict)  # empty: prompt_data in order (data/source.py)
    shuffle_buffer_size: int = 10_000
    num_workers: int = 0
    worker_timeout_s: float = 120.0


@dataclass
class EvalDatasetConfig:
    """One eval dataset; None fields fall back to the eval group's, then the data/rollout group's values."""

    path: str = MISSING
    input_key: Optional[str] = None  # None: data.input_key (the shipped eval sets name theirs)
    label_key: Optional[str] = None
    metadata_key: Optional[str] = None
    rm_type: Optional[str] = None
    n_samples_per_eval_prompt: Optional[int] = None
    eval_temperature: Optional[float] = None
    eval_top_p: Optional[float] = None
    eval_top_k: Optional[int] = None
    eval_max_response_len: Optional[int] = None


@dataclass
class EvalConfig:
    # name -> jsonl path, or name -> {path, input_key, label_key, rm_type, n_samples_per_eval_prompt,
    # eval_temperature, ...} (the fields of EvalDatasetConfig); each logs eval/<name>/accuracy
    eval_prompt_data: dict[str, Any] = field(default_factory=dict)
    eval_interval: Optional[int] = None  # rollouts between evals; None: only before and after training
    skip_eval_before_train: bool = False
    n_samples_per_eval_prompt: int = 1
    eval_reward_key: Optional[str] = None  # None: reward.reward_key
    # None falls back to the rollout value; eval_top_k=1 is greedy decoding
    eval_temperature: Optional[float] = None
    eval_top_p: Optional[float] = None
    eval_top_k: Optional[int] = None
    eval_max_response_len: Optional[int] = None
    save_eval_samples: bool = True  # <output_dir>/eval/<name>/step_<k>.jsonl, logged as artifacts
    # slime's --eval-function-path: async fn(step, rollout, prompts, n_samples, sampling, **kwargs) -> list[Sample],
    # n_samples per prompt in prompt order, generated its own way with the rollout backend (step: the tracker's, 0 before
    # training); the eval set's scoring and metrics stay
    eval_function: dict[str, Any] = field(default_factory=dict)  # empty: each prompt sampled n times


@dataclass
class RewardConfig:
    # math | deepscaler | dapo | f1 | exact_match | boxed_<any of these> | remote_rm;
    # a sample's metadata.rm_type overrides it for that sample
    rm_type: str = "math"
    reward_key: Optional[str] = None  # picks the scalar of a dict reward (dapo: "score")
    # A custom reward: {"_target_": "pkg.module.fn", **kwargs}; fn(sample, **kwargs) -> float | dict,
    # or with group_rm=true fn(samples, **kwargs) -> list; sync or async
    custom_rm: dict[str, Any] = field(default_factory=dict)  # empty: none
    # slime's --custom-reward-post-process-path: fn(samples, group_size, **kwargs) -> list[float], the rewards the
    # advantage estimator receives (one per sample; sample.reward, logged as rollout/reward_mean, stays the raw one)
    custom_reward_post_process: dict[str, Any] = field(default_factory=dict)  # empty: the raw rewards
    group_rm: bool = False
    rm_url: Optional[str] = None  # remote_rm: POST {prompt, response, label} -> float | dict; http:// or https://
    # remote_rm: HTTP header -> the environment variable holding its value, e.g. {Authorization: RM_AUTH} sends the
    # header "Authorization: $RM_AUTH"; secrets stay out of the URL and the config (rewards/remote.py)
    rm_headers: dict[str, str] = field(default_factory=dict)
    rm_max_response_bytes: int = 1 << 20  # remote_rm: a longer answer is a failure, read no further
    rm_concurrency: int = 64
    rm_timeout_s: float = 30.0
    custom_rm_timeout_s: float = 600.0  # seconds one scoring call of custom_rm (all samples it is given) may take
    rm_max_retries: int = 3
    rm_retry_backoff_s: float = 0.5
    rm_on_failure: str = "zero"  # zero: score rm_failure_score and count it | raise: stop the run
    rm_failure_score: float = 0.0


@dataclass
class MegatronConfig:
    """Speed and precision settings of the megatron backend (train.backend=megatron only)."""

    # torch.compile of each transformer layer (Triton kernels fuse the norms, rotary, SwiGLU and residual
    # adds that run unfused without Transformer Engine); CUDA only. 4B seq 2048 on the H200: docs/gpu_results.md
    compile_layers: bool = False
    # megatron DDP's name: accumulate and reduce gradients in fp32 buffers; false keeps them in the params'
    # dtype (half the buffer memory, rounding over micro-batches)
    grad_reduce_in_fp32: bool = True
    # slime's name: tokens per chunk of the fp32 log-prob / entropy computation (training/megatron/logprobs.py);
    # -1: one chunk (materialises [tokens, vocab] fp32 logits)
    log_probs_chunk_size: int = 1024
    # torch.compile of the two per-chunk log-prob kernels (statistics forward, hand-written gradient): one fused
    # pass over the bf16 logits each instead of ~10 eager fp32 passes; CUDA only
    compile_log_probs: bool = False


@dataclass
class TrainConfig:
    backend: str = "torch"  # torch | megatron
    global_batch_size: Optional[int] = None  # samples per optimizer step; derived when None
    num_steps_per_rollout: Optional[int] = None  # optimizer steps per rollout; derived when None
    # slime's default is 1; None: the whole step (a rank's share of global_batch_size) in one micro-batch
    micro_batch_size: Optional[int] = 1
    lr: float = 1e-6
    # validation refuses train.lr / train.critic_lr above 1e-5 for a model of >= 100M parameters whose weights come
    # from model.hf_checkpoint or load= (a warning for a random init): models/checks.py. true: run it anyway
    allow_unsafe_lr: bool = False
    min_lr: float = 0.0
    critic_lr: Optional[float] = None  # ppo's critic; None: lr (min_lr scales with it)
    lr_decay_style: str = "constant"  # constant | linear | cosine
    lr_warmup_iters: int = 0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    # torch's AdamW implementation, in both backends (under megatron's mixed-precision optimizer there): fused (one
    # kernel over all parameters per group; on CPU 1.8 ms vs 8.5 ms per step of the embedded default's 0.8M
    # parameters, on the H200's Qwen3-4B 52.7% vs 51.2% MFU) | foreach | for_loop (torch's CPU default)
    adam_impl: str = "fused"
    clip_grad: float = 1.0
    # Leave samples whose advantages are all zero out of the backward pass. Exact when no term of the
    # loss (KL, entropy) depends on them; derivation (app/derive.py) turns it off otherwise.
    skip_zero_advantage_samples: bool = True
    # Run each distinct prompt once per micro-batch and share its activations (KV) with the group's
    # samples: the same loss and gradients as the plain forward, fewer FLOPs (training/prefix.py).
    prefix_sharing: bool = True
    # slime's --use-dynamic-batch-size: a rank's samples go into micro-batches by a token budget (balanced, longest
    # first; training/microbatch.py) instead of micro_batch_size samples each; the step's loss and gradient are the same
    use_dynamic_batch_size: bool = False
    max_tokens_per_gpu: Optional[int] = None  # the train pass's budget (padded tokens where the forward pads)
    log_probs_max_tokens_per_gpu: Optional[int] = None  # the forward-only passes' (log-probs, reference, values); None: max_tokens_per_gpu
    # megatron's --qkv-format: bshd runs a micro-batch as rows padded to its longest sample; thd packs its samples into one
    # token stream without padding (position ids restart per sample, attention stays inside each: training/thd.py), and
    # the token budget then counts real tokens. Every pass: policy, reference, log-probs, the ppo critic;
    # model.model_impl=native packs the policy whatever this says. train.backend=megatron: thd with TP/DP only
    # (training/megatron/checks.py)
    qkv_format: str = "bshd"
    megatron: MegatronConfig = field(default_factory=MegatronConfig)  # read by train.backend=megatron only
    # slime's megatron hooks (train.backend=megatron; each runs on every train rank). --custom-megatron-init-path:
    # fn(**kwargs) once megatron's process groups exist, before the models are built
    custom_megatron_init: dict[str, Any] = field(default_factory=dict)
    # --custom-megatron-before-log-prob-hook-path: fn(model: list[Module], store_prefix: str, **kwargs) before each
    # forward-only log-prob pass ("": the policy's old log-probs, "ref_": the KL reference's)
    custom_megatron_before_log_prob_hook: dict[str, Any] = field(default_factory=dict)
    # --custom-megatron-before-train-step-hook-path: fn(rollout_id, step_id, model: list[Module], optimizer, **kwargs)
    # before each optimizer step of the policy (step_id: the step's index within its rollout)
    custom_megatron_before_train_step_hook: dict[str, Any] = field(default_factory=dict)


@dataclass
class WarmStartConfig:
    """A supervised warm start before RL, with the SFT loss (slime has no warm-start phase: it trains SFT as a separate
    run with --loss-type sft_loss, algorithm.loss_type=sft_loss here); steps=0 disables it (and its checks)."""

    steps: int = 0  # SFT steps; with target_train_accuracy, the most it may take
    lr: float = 1e-3
    batch_size: int = 64
    # Stop at the first check (every check_interval steps) where greedy accuracy on check_prompts training prompts
    # (the reward's verifier) reaches this; null: always `steps`. Lands at one accuracy whatever the seed or numerics.
    target_train_accuracy: Optional[float] = None
    min_steps: int = 0  # with target_train_accuracy: no check before this many steps (a floor under the stop)
    check_interval: int = 5
    check_prompts: int = 256
    # {"_target_": "pkg.mod.fn", **kwargs}: fn(prompts, tokenizer, **kwargs) -> list[Sample] (tokens, response_length,
    # loss_mask); e.g. multi-turn demonstrations. Empty: `label + eos` after each prompt.
    custom_sft_samples: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoggerConfig:
    tracker: str = "mlflow"  # mlflow | tensorboard | wandb | none
    tracking_uri: str = "sqlite:///mlruns.db"
    mlflow_experiment: str = "slime_hydra"
    tensorboard_dir: str = "tensorboard"
    # -- tracker=wandb (slime's --wandb-* flags; tracking/wandb_tracker.py) --
    # offline: the run is written under <output_dir>/<wandb_dir> and nothing leaves the machine (`wandb sync` uploads
    # it later) | online: sent as it runs; needs the key in the environment (WANDB_API_KEY), never in the config, which
    # is logged and saved | disabled. slime's default is W&B's (online unless WANDB_MODE says otherwise)
    wandb_mode: str = "offline"
    wandb_project: str = "slime_hydra"  # slime: None (W&B's "uncategorized")
    wandb_team: Optional[str] = None  # W&B entity; None: the key's default entity
    wandb_group: Optional[str] = None
    wandb_run_name: Optional[str] = None  # None: the run's name, as MLflow gets it (slime: wandb_group + a random suffix)
    wandb_host: Optional[str] = None  # a W&B server's URL (online); None: W&B's cloud
    wandb_dir: str = "wandb"  # under the run's output directory
    # a tracker call that fails is retried this many times (exponential backoff from tracker_retry_backoff_s), then
    # given up with a warning: the run goes on, its checkpoints written; points not logged are sent again once the
    # tracker works, and those still missing are reported at the end (tracking/retrying.py)
    tracker_retries: int = 2
    tracker_retry_backoff_s: float = 1.0
    tracker_timeout_s: float = 10.0  # seconds one request to an MLflow tracking server may take (http(s) URIs)
    progress_bar: bool = True
    # slime's --custom-rollout-log-function-path: fn(rollout_id, samples, metrics, rollout_time, **kwargs) -> True (leave
    # the rollout/* metrics out) | a dict (more metrics, logged with the step's) | None
    custom_rollout_log_function: dict[str, Any] = field(default_factory=dict)
    # slime's --custom-eval-rollout-log-function-path: fn(step, samples: {set: list[Sample]}, metrics, **kwargs)
    # -> True (leave the eval/* metrics out) | a dict (more metrics) | None
    custom_eval_rollout_log_function: dict[str, Any] = field(default_factory=dict)
    # A multirun's summary (tracking/sweep.py) ranks its jobs by this metric's last value and tags the best on the
    # parent run. None: the first eval/<set>/accuracy the jobs reported (by name), else rollout/reward_mean.
    sweep_rank_metric: Optional[str] = None
    sweep_rank_direction: str = "max"  # max | min: which end of sweep_rank_metric is best


@dataclass
class ClusterConfig:
    """slime's resource keys (actor_*, rollout_num_gpus*, colocate, offload_*) and this project's own (backend, address,
    the memory plan, timeouts, device); one process on CPU by default.

    With backend=ray the keys lay out one placement group: one bundle per GPU, the actor slice
    (actor_num_nodes × actor_num_gpus_per_node, one data-parallel train rank each) then the rollout
    slice (rollout_num_gpus, one engine per rollout_num_gpus_per_engine); colocate shares the actor's
    bundles. On a machine without GPUs each "GPU" is a bundle of one CPU, so CI runs the same code.
    """

    backend: str = "local"  # local: one process (trainer and rollout in the driver) | ray: placement group + actors
    # Ray cluster to use with backend=ray: None: $RAY_ADDRESS if set, else a new local cluster;
    # "local": always a new local cluster; "auto" or "host:port": an existing cluster (`ray start --head`).
    # A new local cluster is the run's own: token auth, bound to 127.0.0.1 (orchestration/local_cluster.py)
    address: Optional[str] = None
    actor_num_nodes: int = 1
    actor_num_gpus_per_node: int = 1
    rollout_num_gpus: Optional[int] = None  # None: the actor's GPUs (colocate); required when not colocated
    rollout_num_gpus_per_engine: int = 1
    colocate: bool = True
    # slime: None means "offload when colocated" (offload_train: and train_mode=sync). offload_train: while the engines generate, the trainer's parameters,
    # gradients and optimizer state (reference model and critic too) wait in host memory (training/offload.py), and the
    # engines start with the trainer released. offload_rollout: SGLang engines release their KV cache and CUDA graphs
    # while the trainer trains and syncs (their weights stay). docs/memory.md
    offload_train: Optional[bool] = None
    offload_rollout: Optional[bool] = None
    # GiB (2**30 bytes, as torch and SGLang count; an "80 GB" card holds 79.6) of each GPU, for the memory plan that
    # `slime-hydra plan` prints and validation checks (docs/memory.md). None: the first CUDA device of the machine
    # validating the run, if it has one; otherwise the plan is printed without a verdict.
    gpu_memory_gb: Optional[float] = None
    allow_over_memory: bool = False  # run a layout the memory plan says does not fit (its problem becomes a warning)
    placement_timeout_s: float = 60.0  # how long to wait for the placement group before reporting it cannot fit
    # every wait of the driver (and of the rollout manager) on a Ray actor: a train step, a weight sync, a generate, a
    # checkpoint's state (orchestration/calls.py). Past it the run stops (exit 3) naming the step, the actor and the
    # checkpoint to resume from; a dead actor stops it at once. Generous: one train step at scale can take many minutes.
    ray_call_timeout_s: float = 3600.0
    # torch.distributed group creation and each collective of the train ranks (cluster.backend=ray's data-parallel
    # ranks, megatron's groups): gloo raises past it; NCCL's watchdog ends the rank's process (torch's default
    # TORCH_NCCL_ASYNC_ERROR_HANDLING=3). Below ray_call_timeout_s, so a rank stuck in an all-reduce reports itself first.
    distributed_timeout_s: float = 1800.0
    device: str = "auto"  # auto | cpu | cuda
    num_threads: Optional[int] = None  # torch intra-op threads (per actor with backend=ray: default 1); None keeps torch's choice


@dataclass
class RunConfig:
    """The composed run. Groups are typed nodes; run-level keys sit at the top."""

    model: ModelConfig = MISSING
    algorithm: AlgorithmConfig = MISSING
    parallelism: ParallelismConfig = MISSING
    rollout: RolloutConfig = MISSING
    data: DataConfig = MISSING
    eval: EvalConfig = MISSING
    reward: RewardConfig = MISSING
    train: TrainConfig = MISSING
    warmstart: WarmStartConfig = MISSING
    logger: LoggerConfig = MISSING
    cluster: ClusterConfig = MISSING

    experiment_name: str = "default"
    seed: int = 1234
    num_rollout: Optional[int] = None
    num_epoch: Optional[int] = None  # with num_rollout unset: num_rollout = num_epoch × prompts // rollout_batch_size
    # sync: generate rollout k, then train on it. async (slime's train_async.py): generation of rollout k+1
    # runs while training on rollout k (slime_hydra/engine/feeds.py: AheadGenerator)
    train_mode: str = "sync"
    # async: rollouts that may be generated ahead of training (their staleness bound). This project's key: slime's
    # train_async.py always generates one ahead (1)
    async_buffer_size: int = 1
    # async: seconds one rollout generated ahead may take from the start of its generation before the run stops (exit 3)
    # naming it; the trainer's waits on the generation worker (engine/feeds.py) have no other deadline
    async_rollout_timeout_s: float = 3600.0
    update_weights_interval: int = 1  # rollouts between weight syncs to the rollout engine, never mid-generation
    # a directory: each rollout's samples (kept and dropped) go to rollout_NNNNNN.jsonl in it; or a path
    # with "{rollout_id}" (quote it on the command line: save_debug_rollout_data='dir/{rollout_id}.jsonl')
    save_debug_rollout_data: Optional[str] = None
    # slime's debug split (README "Replay and rollout-only"). load_debug_rollout_data: a directory or glob of dumps
    # written by save_debug_rollout_data; the run trains on their samples with no rollout engine (implies
    # debug_train_only, which alone has nothing to train on). debug_rollout_only: generate and score (and dump) with
    # no trainer built; its checkpoints hold no weights and only a rollout-only run resumes them.
    load_debug_rollout_data: Optional[str] = None
    debug_train_only: bool = False
    debug_rollout_only: bool = False
    save: Optional[str] = None  # checkpoint directory; None: <output_dir>/checkpoints
    save_interval: Optional[int] = None  # rollouts between checkpoints; the last one is always saved
    # resume from: one checkpoint directory (<save>/rollout_NNNNNN), which must load (a broken file stops the run with
    # exit code 2, naming it; never swapped for another), or a save root, which resumes from the checkpoint `latest`
    # names or, when that one does not load, the newest older one that does, with a warning naming each one skipped
    # (checkpoints newer than `latest` are never taken). engine/checkpoint.py, docs/reliability.md
    load: Optional[str] = None
    output_dir: Optional[str] = None  # None: the Hydra job's output directory
    # Stall watchdog (engine/watchdog.py): once a rollout step has finished, if the next one does not finish within
    # max(stall_min_timeout_s, stall_timeout_factor x the longest of the last 5 steps), every thread's stack goes to
    # <output_dir>/stall_stacks.txt and the run fails (exit 3) naming it and the last checkpoint.
    stall_watchdog: bool = True
    stall_timeout_factor: float = 10.0
    stall_min_timeout_s: float = 600.0
    # SIGTERM / SIGINT (a scheduler's stop, Ctrl-C): the run finishes its step, writes a checkpoint, marks its tracker run
    # KILLED, stops its children and actors and exits 143 / 130, all within this many seconds of the signal; past it
    # (or at a second signal) the step is abandoned and the process exits at once (app/stop.py). Below SLURM's 30 s.
    stop_grace_s: float = 20.0
    # the run's files are its user's only: umask 077 from the start of the run (checkpoints, weights, the MLflow store,
    # Ray's temp dir) and its output directory made owner-only; false keeps the process's umask
    private_files: bool = True


# group name -> schema, registered under schema/<group> in the ConfigStore
GROUP_SCHEMAS: dict[str, type] = {
    "model": ModelConfig,
    "algorithm": AlgorithmConfig,
    "parallelism": ParallelismConfig,
    "rollout": RolloutConfig,
    "data": DataConfig,
    "eval": EvalConfig,
    "reward": RewardConfig,
    "train": TrainConfig,
    "warmstart": WarmStartConfig,
    "logger": LoggerConfig,
    "cluster": ClusterConfig,
}
