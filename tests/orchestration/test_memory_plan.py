"""The memory plan against figures worked out by hand: Qwen3-0.6B on one GPU, Qwen3-4B on 8 GPUs at TP=2, Qwen3-30B-A3B
with expert parallelism 8; and its verdict (what is refused, and the keys the refusal names).

Notation as orchestration/train_memory.py: a = 2 bytes (bf16), h hidden, f ffn, n heads, g query groups, d head dim,
t TP, V the vocabulary (151,936 = 1187 × 128: megatron pads it only from TP=2, to a multiple of 256: 152,064).
A CUDA context is 0.5 GiB = 536,870,912 B; 1 GiB = 1,073,741,824 B.
"""

from __future__ import annotations

import pytest

from slime_hydra.app import memory
from slime_hydra.app.plan import compose_for_plan, plan_text
from slime_hydra.app.preflight import compose_run
from slime_hydra.config.schema import ModelConfig, ParallelismConfig
from slime_hydra.errors import ConfigError
from slime_hydra.models.size import num_parameters
from slime_hydra.orchestration import memory_plan as MP
from slime_hydra.orchestration import train_memory as TM

GIB = 1 << 30
QWEN3_06B = "grpo/qwen3-0.6b-addition-1n1g-megatron-sglang-colocate-v1"
QWEN3_4B = "grpo/qwen3-4b-dapo-math-1n8g-megatron-sglang-colocate-v1"
HERE = ["model.hf_checkpoint=null", "data.prompt_data=${asset:addition/train.jsonl}", "eval.eval_prompt_data.aime=${asset:addition/test.jsonl}"]  # runs here


def planned(name: str, gib: float, *extra: str) -> memory.Plan:
    cfg, _, _ = compose_for_plan([f"experiment={name}", f"cluster.gpu_memory_gb={gib}", *extra])
    return memory.plan(cfg, int(gib * GIB))


def test_qwen3_06b_on_one_gpu():
    """The shipped 1n1g megatron experiment: bf16, fp32 gradients, eager layers and log-probs (chunks of 1024), packed
    micro-batches of train.max_tokens_per_gpu=8192 tokens, no reference; one SGLang engine at mem_fraction_static=0.3,
    neither offload; a 140 GiB GPU (150,323,855,360 B).
    P, per layer: attention h(n + 2g)d + n·d·h = 1024·32·128 + 2048·1024 = 6,291,456, q/k norms 2d = 256, two norms 2h
    = 2048, MLP 3hf = 9,437,184: 15,730,944; × 28 + V·h (tied) 155,582,464 + final norm 1024 = 596,049,920."""
    p = planned(QWEN3_06B, 140)
    t = p.train
    assert t.params == 596_049_920
    assert (t.weights, t.grads, t.main_params, t.optimizer) == (2 * t.params, 4 * t.params, 4 * t.params, 8 * t.params)
    assert t.state == 10_728_898_560  # 18 bytes × P
    assert t.built == 5_960_499_200  # weights, the gradient buffer, main parameters: 10 bytes × P
    # per token and layer: 4ah + 8 = 8,200; a(n+2g)d = 8,192; a(n+g)d = 6,144; 2a·n·d = 8,192; 4(2n+g) = 160; 4af = 24,576
    assert t.per_token_layer == 8_200 + 8_192 + 6_144 + 8_192 + 160 + 24_576 == 55_464
    assert t.tokens == 8192
    assert t.activations == 28 * 8192 * 55_464 == 12_722_110_464
    # final norm 2ah + logits and gradient 2aV per token; four fp32 [1024, V] temporaries: 4 · 4 · 1024 · 151,936
    assert t.logprob_pass == 8192 * (4_096 + 607_744) + 2_489_319_424 == 7_501_512_704
    assert t.peak == 10_728_898_560 + 12_722_110_464 + 7_501_512_704 == 30_952_521_728  # 28.83 GiB
    # staged for the engine between syncs: gate and up cut out of fc1, 2hf per layer; one bucket of 512 MiB at a sync
    assert (t.staging, t.bucket) == (2 * 1024 * 3072 * 28 * 2, 536_870_912) == (352_321_536, 536_870_912)
    e = p.engine
    assert (e.weights, e.kv_per_token) == (2 * 596_049_920, 2 * 28 * 8 * 128 * 2) == (1_192_099_840, 114_688)
    g = p.gpus["train + engine"]
    # the engine starts beside the built trainer: F = 150,323,855,360 - 2 contexts - 5,960,499,200 = 143,289,614,336
    assert g.free_at_start == 143_289_614_336 and g.pool == 42_986_884_300  # 0.3 F
    # generating: 2 contexts + the trainer's peak and staged copy + the pool; training: the same (peak > state +
    # staging + bucket = 11,618,091,008), the engine keeping its pool
    assert g.generate == g.train == 1_073_741_824 + 30_952_521_728 + 352_321_536 + 42_986_884_300 == 75_365_469_388
    assert g.peak <= 140 * GIB


def test_qwen3_4b_on_8_gpus_at_tp2():
    """The shipped 1n8g recipe: TP=2 (DP=4, no distributed optimizer), full recompute of each layer, packed micro-batches
    of 9216 tokens, a reference model (algorithm.use_kl_loss); engines of TP=2 at mem_fraction_static=0.7; an 80 GiB
    GPU (85,899,345,920 B).
    Per rank: attention (2560·48·128 + 4096·2560) / 2 = 13,107,200, norms 2d + 2h = 5,376, MLP 3hf / 2 = 37,355,520:
    50,468,096 a layer, × 36 = 1,816,851,456; embedding 152,064 · 2560 / 2 = 194,641,920; final norm 2560."""
    p = planned(QWEN3_4B, 80)
    t = p.train
    assert t.params == 1_816_851_456 + 194_641_920 + 2_560 == 2_011_495_936
    assert t.reference == 2 * t.params
    assert t.state == 20 * t.params == 40_229_918_720  # 18 bytes × P + the bf16 reference
    # t = 2: 4ah + 8 = 20,488; 2·48·128/2 = 6,144; 2·40·128/2 = 5,120; 2·2·4096/2 = 8,192; 4·72/2 = 144; 8·9728/2 = 38,912
    assert t.per_token_layer == 79_000
    # full recompute, one layer a block: 36 layer inputs (a·h) kept, one layer's activations at a time
    assert t.activations == 9216 * (36 * 5_120 + 79_000) == 2_426_757_120
    # V/t = 76,032: 9216 · (2·2·2560 + 2·2·76,032) + 4 · 4 · 1024 · 76,032
    assert t.logprob_pass == 9216 * 314_368 + 1_245_708_288 == 4_142_923_776
    assert t.peak == 40_229_918_720 + 2_426_757_120 + 4_142_923_776 == 46_799_599_616  # 43.59 GiB
    assert t.staging == 2 * 4_022_468_096  # every rank keeps the TP-gathered model (its whole 4,022,468,096 parameters)
    # the engine rank: the same split with the vocabulary unpadded (151,936 · 2560 / 2 = 194,478,080); KV: 8 groups / 2
    assert p.engine.weights == 2 * (1_816_851_456 + 194_478_080 + 2_560) == 4_022_664_192
    assert p.engine.kv_per_token == 2 * 36 * 4 * 128 * 2 == 73_728
    g = p.gpus["train + engine"]  # both offloads (the recipe's): the engines start on a GPU the trainer released
    assert g.free_at_start == 85_899_345_920 - 1_073_741_824 == 84_825_604_096 and g.pool == 59_377_922_867  # 0.7 F
    assert g.generate == 1_073_741_824 + 59_377_922_867 == 60_451_664_691
    # training: at the sync the state, the new staged copy and a bucket (48,811,725,824) beat the step's peak; the engine
    # keeps only its weights
    assert g.train == 1_073_741_824 + 40_229_918_720 + 8_044_936_192 + 536_870_912 + 4_022_664_192 == 53_908_131_840
    assert g.peak <= 80 * GIB
    none = planned(QWEN3_4B, 80, "cluster.offload_train=false", "cluster.offload_rollout=false").gpus["train + engine"]
    # F less the built trainer (10 bytes × P = 20,114,959,360); the old staged copy stays through training
    assert none.free_at_start == 64_710_644_736 and none.pool == 45_297_451_315
    assert none.train == 1_073_741_824 + 8_044_936_192 + 48_811_725_824 + 45_297_451_315 == 103_227_855_155  # 96.1 GiB
    assert none.peak > 80 * GIB


def test_qwen3_30b_a3b_with_expert_parallelism():
    """8 ranks, EP=8, TP=PP=1, the distributed optimizer: dense parameters shard their optimizer state over DP = 8, the
    experts (each rank holds 128 / 8 = 16 of every layer's) over the expert data-parallel ranks 8 / (EP·TP) = 1.
    Per layer: attention 2048·40·128 + 4096·2048 = 18,874,368, norms 2d + 2h = 4,352, router h·E = 262,144 (dense);
    experts 16 · 3 · 2048 · 768 = 75,497,472. Untied: embedding and output layer 151,936 · 2048 each."""
    m = ModelConfig(architecture="qwen3_moe", num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
                    num_query_groups=4, kv_channels=128, vocab_size=151936, untie_embeddings_and_output_weights=True,
                    num_experts=128, moe_ffn_hidden_size=768, moe_router_topk=8, dtype="bfloat16")
    lay = TM.Layout.of(ParallelismConfig(expert_model_parallel_size=8, use_distributed_optimizer=True), 8, megatron=True)
    assert (lay.dp, lay.expert_dp) == (8, 1)
    r = TM.rank_params(m, lay, 151936)
    assert r.dense == 48 * (18_874_368 + 4_352 + 262_144) + 2 * 311_164_928 + 2048 == 1_541_093_376
    assert r.expert == 48 * 75_497_472 == 3_623_878_656
    whole = TM.rank_params(m, TM.Layout(1), 151936)
    assert whole.total == 30_532_122_624 == num_parameters(m)  # the same count as validation's
    weights, grads, main, adam = TM.state_bytes(r, lay, "bfloat16", megatron=True, grad_fp32=True)
    shard = 1_541_093_376 // 8 + 3_623_878_656  # 3,816,515,328 parameters of optimizer state on this rank
    assert (weights, grads, main, adam) == (2 * r.total, 4 * r.total, 4 * shard, 8 * shard)
    assert weights + grads + main + adam == 76_788_016_128  # 71.5 GiB
    # a routed token: top-8 experts' MLPs (4a·768) with its dispatched copies in and out (2a·h), the router's fp32 logits
    assert TM.per_token_layer(m, 1, compiled=False, hf_norms=False) == \
        16_392 + 10_240 + 9_216 + 16_384 + 272 + 8 * (6_144 + 8_192) + 4 * 128 == 167_704


def test_dense_parameters_equal_validations_count():
    for name in ("qwen3_0_6b", "qwen3_4b", "qwen3_8b", "llama3_8b", "glm4_9b"):
        cfg = compose_run([f"model={name}"])
        assert TM.rank_params(cfg.model, TM.Layout(1), cfg.model.vocab_size, pad=False).total == num_parameters(cfg.model), name


def test_the_vocabulary_is_padded_as_megatron_pads_it():
    from tests.support.megatron_cpu import shim  # megatron-core on CPU: its padding function is what the model builds

    shim.install()
    from slime_hydra.training.megatron.model import padded_vocab_size

    for vocab in (70, 151_936, 151_552, 32_000, 129_280):
        for tp in (1, 2, 4, 8):
            assert TM.padded_vocab(vocab, tp) == padded_vocab_size(vocab, tp)


def test_a_layout_that_fits_only_with_offload_is_refused_naming_the_keys():
    args = [f"experiment={QWEN3_4B}", "cluster.gpu_memory_gb=80", "cluster.offload_train=false", "cluster.offload_rollout=false"]
    cfg, _, refused = compose_for_plan(args)
    (msg,) = [r for r in refused if r.startswith(memory.REFUSED)]
    assert "needs 96.1 GiB on a GPU" in msg and "more than its 80.0 GiB (cluster.gpu_memory_gb=80)" in msg, msg
    assert "set cluster.offload_train=true cluster.offload_rollout=true (then 56.3 GiB)" in msg, msg
    assert "lower rollout.sglang.mem_fraction_static to 0.4" in msg, msg
    # the fraction it names fits without offload
    f = float(msg.split("mem_fraction_static to ")[1].split()[0])
    lower = planned(QWEN3_4B, 80, "cluster.offload_train=false", "cluster.offload_rollout=false",
                    f"rollout.sglang.mem_fraction_static={f}")
    assert lower.peak <= 80 * GIB
    text = plan_text(args)  # the plan prints the table, then the refusal
    assert "does NOT fit 80.0" in text and text.index("memory: GiB per GPU") < text.index("does not fit (a run stops")
    with pytest.raises(ConfigError) as info:  # a run is refused at validation
        compose_run(args + HERE)
    assert any(p.startswith(memory.REFUSED) and "cluster.offload_train=true" in p for p in info.value.problems)
    # allow_over_memory: a warning, not a refusal
    cfg = compose_run(args + HERE + ["cluster.allow_over_memory=true"])
    assert cfg.cluster.allow_over_memory


def test_a_layout_that_does_not_fit_at_all_names_what_shrinks_it():
    args = [f"experiment={QWEN3_4B}", "cluster.gpu_memory_gb=40", *HERE]
    with pytest.raises(ConfigError) as info:
        compose_run(args)
    (msg,) = [p for p in info.value.problems if p.startswith(memory.REFUSED)]
    # training: 1 GiB of contexts + state 37.47 + the staged copy 7.49 + a bucket 0.5 + the engine's weights 3.75
    assert "needs 50.2 GiB on a GPU (train + engine GPU while training" in msg, msg
    for key in ("parallelism.tensor_model_parallel_size (2)", "parallelism.use_distributed_optimizer=true",
                "train.max_tokens_per_gpu (9216)", "rollout.sglang.mem_fraction_static (0.7)"):
        assert key in msg, (key, msg)
    assert "cluster.offload_train=true" not in msg  # already on


def test_an_engine_pool_smaller_than_its_weights_is_refused():
    """0.005 of F = 140 - 1 (contexts) - 5.55 (the built trainer) = 133.45 GiB is 0.67 GiB, for 1.11 GiB of weights."""
    with pytest.raises(ConfigError) as info:
        compose_run([f"experiment={QWEN3_06B}", "cluster.gpu_memory_gb=140", "model.hf_checkpoint=null",
                     "rollout.sglang.mem_fraction_static=0.005"])
    assert any("leaves an SGLang engine 0.7 GiB for 1.1 GiB of weights" in p for p in info.value.problems), info.value.problems


def test_offload_train_with_async_is_refused():
    with pytest.raises(ConfigError) as info:
        compose_run(["train_mode=async", "cluster.offload_train=true"])
    assert any("train_mode=async trains while they generate; set cluster.offload_train=false" in p for p in info.value.problems)


def test_no_verdict_without_device_memory():
    """On a machine without CUDA and without cluster.gpu_memory_gb the plan prints the trainer's figures, no verdict."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the plan reads it")
    text = plan_text([f"experiment={QWEN3_4B}"])
    assert "device unknown (no CUDA device on this machine: set cluster.gpu_memory_gb (GiB) for a verdict)" in text
    assert "peak 43.59" in text and "not planned" in text


def test_largest_fraction_is_the_edge():
    """largest_fraction(f*): the colocated layout without offload at f* reaches the device exactly (to a byte per
    rounding), a hundredth above it does not fit."""
    cfg, _, _ = compose_for_plan([f"experiment={QWEN3_4B}", "cluster.gpu_memory_gb=80"])
    device = 80 * GIB
    f = MP.largest_fraction(memory.plan(cfg, device).train, device, offload_train=False)
    at = memory.plan(cfg, device, offload_train=False, offload_rollout=False, mem_fraction_static=f).peak
    above = memory.plan(cfg, device, offload_train=False, offload_rollout=False, mem_fraction_static=f + 0.01).peak
    assert abs(at - device) <= 2 and above > device


@pytest.mark.gpu
def test_the_device_is_read_when_no_size_is_given():
    """cluster.gpu_memory_gb unset on a GPU machine: the driver's figure for the first GPU, which torch agrees with."""
    import torch

    from slime_hydra.config.schema import ClusterConfig

    got, source = memory.device_memory(ClusterConfig(device="cuda"))
    assert abs(got - torch.cuda.get_device_properties(0).total_memory) <= 0.01 * got, (got, source)
    assert "this machine's first GPU" in source
