"""Packed micro-batches (train.qkv_format=thd, training/thd.py) on the torch backend, float64 on CPU.

The layout by hand; attention confined to each sample (a packed sample's log-probs equal it run alone);
packed = padded for every policy loss and aggregation the backend supports (test_algorithms_backend's
cases), with fixed micro-batches and with the token budget (which then counts real tokens); split
invariance of the packed path (one micro-batch = micro-batches of one = the budget's); the log-prob pass
and the SFT step; validation.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from slime_hydra.algorithms import losses as L
from slime_hydra.app.checks import check
from slime_hydra.app.preflight import compose_run, preflight
from slime_hydra.config.schema import AlgorithmConfig, TrainConfig
from slime_hydra.errors import ConfigError
from slime_hydra.training.thd import pack, thd_logits, unpack
from tests.support import trainers, warm_spawn
from tests.support.tiny import CASES, CPU, MAX_LEN, TOK, base_model, make_batch, samples

torch.set_num_threads(1)


# -- the layout -----------------------------------------------------------------------------------
def test_pack_layout_by_hand():
    # three right-padded samples of 3, 2 and 4 tokens. Each puts all but its last token in the stream (the last
    # predicts nothing): 2 + 1 + 3 = 6 packed tokens
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]])
    attn = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    p = pack(ids, attn)
    assert p.input_ids.tolist() == [[5, 6, 8, 1, 2, 3]]
    assert p.position_ids.tolist() == [[0, 1, 0, 0, 1, 2]]  # restarting at 0 per sample
    assert p.targets.tolist() == [6, 7, 9, 2, 3, 4]  # = ids[:, 1:] on the real targets, in order
    assert p.cu_seqlens.tolist() == [0, 2, 3, 6] and p.cu_seqlens.dtype == torch.int32 and p.max_seqlen == 3
    # [n, T=3]: the packed token predicting each target, 6 (the padding slot) past a sample's end
    assert p.index.tolist() == [[0, 1, 6], [2, 6, 6], [3, 4, 5]]
    x = torch.tensor([10.0, 11, 12, 13, 14, 15])
    assert unpack(x, p).tolist() == [[10, 11, 0], [12, 0, 0], [13, 14, 15]]
    assert unpack(x[:, None].expand(6, 2), p).shape == (3, 3, 2)  # trailing dims ride along


def packed_log_probs(model, ids, attn):
    p = pack(ids, attn)
    return unpack(L.log_probs_from_logits(thd_logits(model, p), p.targets), p)


@pytest.mark.parametrize("attn_impl", ["sdpa", "eager"])
def test_packed_samples_attend_only_to_themselves(attn_impl):
    """Each sample's packed log-probs (thd_attention: one SDPA call per sample, whatever model.attn_implementation)
    equal the sample run alone with the model's own attention, and changing one sample's tokens leaves every other
    sample's log-probs bit-equal. Eager attention takes its softmax in float32 (transformers' eager_attention_forward):
    ~1e-8 from SDPA's float64."""
    model = base_model()
    model.config._attn_implementation = attn_impl
    batch = make_batch()
    lengths = batch.attention_mask.sum(-1).tolist()
    with torch.no_grad():
        got = packed_log_probs(model, batch.input_ids, batch.attention_mask)
        assert model.config._attn_implementation == attn_impl  # restored after the packed forward
        for i, n in enumerate(lengths):
            alone = L.log_probs_from_logits(model(input_ids=batch.input_ids[i : i + 1, :n]).logits[0, :-1],
                                            batch.input_ids[i, 1:n])
            tol = 1e-12 if attn_impl == "sdpa" else 1e-7
            assert_close(got[i, : n - 1], alone, rtol=tol, atol=tol)
            assert (got[i, n - 1 :] == 0).all()
        changed = batch.input_ids.clone()
        changed[0, 1:lengths[0]] = changed[0, 1:lengths[0]].flip(0)
        other = packed_log_probs(model, changed, batch.attention_mask)
        assert torch.equal(other[1:], got[1:]) and not torch.equal(other[0], got[0])


def test_transformers_own_packing_agrees_but_needs_no_cache():
    """transformers reads packing off restarting position ids (masking_utils.find_packed_sequence_indices) and builds a
    dense [S, S] block mask: the same logits as thd_attention. Only without a KV cache: with the config's
    use_cache=true it makes one and the mask stays plain causal, so samples see their neighbours."""
    model = base_model()
    batch = make_batch()
    p = pack(batch.input_ids, batch.attention_mask)
    with torch.no_grad():
        ours = thd_logits(model, p)
        theirs = model(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=False).logits[0]
        leaky = model(input_ids=p.input_ids, position_ids=p.position_ids, use_cache=True).logits[0]
    assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    first = int(p.cu_seqlens[1])
    assert torch.equal(leaky[:first], theirs[:first])  # the first sample has no neighbour before it
    assert (leaky[first:] - theirs[first:]).abs().max() > 1e-3


# -- the backend: packed = padded -----------------------------------------------------------------
def backend(algo: AlgorithmConfig, qkv_format: str, steps: int = 1, **train_kw):
    train = TrainConfig(global_batch_size=8 // steps, num_steps_per_rollout=steps, lr=1e-3, clip_grad=0.0,
                        prefix_sharing=False, skip_zero_advantage_samples=not (algo.use_kl_loss or algo.entropy_coef),
                        qkv_format=qkv_format, **train_kw)
    b = trainers.torch_backend(base_model(), algo, train, temperature=1.0, total_steps=10, device=CPU, max_response_len=MAX_LEN)
    b.freeze_reference()
    return b


METRICS = ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy", "train/pg_clipfrac", "train/ppo_kl")


def assert_same_step(a, b, ma, mb, tag):
    for key in METRICS + tuple(k for k in ("train/kl_loss", "train/tis_clipfrac", "train/rollout_logprob_abs_diff") if k in ma):
        assert abs(ma[key] - mb[key]) <= 1e-9 * max(1.0, abs(ma[key])), (tag, key, ma[key], mb[key])
    assert ma.keys() == mb.keys()
    for (name, p), q in zip(a.model.named_parameters(), b.params):
        assert_close(q, p, rtol=1e-9, atol=1e-12, msg=lambda m: f"{tag} {name}: {m}")


def batch_for(algo: AlgorithmConfig):
    return make_batch(algo.advantage_estimator, grpo_std_normalization=algo.grpo_std_normalization,
                      normalize_advantages=algo.normalize_advantages)


@pytest.mark.parametrize("case", list(CASES))
def test_packed_step_equals_padded_step(case):
    """Two optimizer steps per rollout (the second step's old log-probs come from the log-prob pass), micro-batches
    of 2 samples: the same loss terms, metrics and updated weights, padded or packed."""
    algo = AlgorithmConfig(**CASES[case])
    batch = batch_for(algo)
    padded, packed = backend(algo, "bshd", steps=2, micro_batch_size=2), backend(algo, "thd", steps=2, micro_batch_size=2)
    m_pad, m_pack = padded.train_rollout(batch), packed.train_rollout(batch)
    assert m_pad["train/grad_norm"] > 0
    assert_same_step(padded, packed, m_pad, m_pack, case)


@pytest.mark.parametrize("case", ["grpo-token_mean", "grpo-seq_mean_token_sum", "dr_grpo-seq_mean_token_sum_norm",
                                  "kl_loss-unbiased-entropy"])
def test_packed_with_the_token_budget_equals_padded(case):
    """The token budget (train 16, log-prob pass 30) on the packed path vs fixed padded micro-batches of 1 and one
    padded micro-batch of the whole step."""
    algo = AlgorithmConfig(**CASES[case])
    batch = batch_for(algo)
    whole = backend(algo, "bshd", steps=2, micro_batch_size=4)
    ones = backend(algo, "bshd", steps=2, micro_batch_size=1)
    dyn = backend(algo, "thd", steps=2, micro_batch_size=1, use_dynamic_batch_size=True,
                  max_tokens_per_gpu=16, log_probs_max_tokens_per_gpu=30)
    m_whole, m_ones, m_dyn = (b.train_rollout(batch) for b in (whole, ones, dyn))
    assert_same_step(whole, dyn, m_whole, m_dyn, case)
    assert_same_step(ones, dyn, m_ones, m_dyn, case)


def test_packed_split_invariance():
    """Packed only: one micro-batch of the step = micro-batches of one = the token budget's micro-batches."""
    algo = AlgorithmConfig(loss_aggregation="token_mean", use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01)
    batch = batch_for(algo)
    whole = backend(algo, "thd", micro_batch_size=8)
    ones = backend(algo, "thd", micro_batch_size=1)
    dyn = backend(algo, "thd", micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=16)
    m_whole, m_ones, m_dyn = (b.train_rollout(batch) for b in (whole, ones, dyn))
    assert_same_step(whole, ones, m_whole, m_ones, "ones")
    assert_same_step(whole, dyn, m_whole, m_dyn, "budget")


def test_the_packed_budget_counts_real_tokens():
    # rows of 9, 9, 7, 6, 7, 6, 6, 6 tokens, budget 16. Padded (rows x longest): [9] [9] [7, 7] [6, 6] [6, 6]
    # (tests/training/test_microbatch.py). Packed (sums), LPT from k = max(ceil(56 / 16), two rows above 8) = 4: 9 | 9 | 7 | 7;
    # 6 (row 3) -> the 7s tie, lower bin -> 13; 6 (row 5) -> 13; 6 (row 6) -> 15; 6 (row 7) -> 15: 4 micro-batches
    algo = AlgorithmConfig()
    batch = make_batch()
    rows = torch.arange(8)
    padded = backend(algo, "bshd", micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=16)
    packed = backend(algo, "thd", micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=16)
    assert [g.tolist() for g in padded._micro_batches(batch, rows)] == [[0], [1], [2, 4], [3, 5], [6, 7]]
    assert [g.tolist() for g in packed._micro_batches(batch, rows)] == [[0, 6], [1, 7], [2, 3], [4, 5]]


def test_packed_log_prob_pass_and_sft_step_equal_padded():
    algo = AlgorithmConfig()
    batch = make_batch()
    padded, packed = backend(algo, "bshd", micro_batch_size=4), backend(algo, "thd", micro_batch_size=4)
    real = batch.attention_mask[:, 1:].bool()
    lp_pad, lp_pack = padded.compute_log_probs(batch), packed.compute_log_probs(batch)
    assert_close(lp_pack[real], lp_pad[real], rtol=1e-12, atol=1e-12)
    assert (lp_pack[~real] == 0).all()  # past a row's end: nothing, where the padded pass scores its padding
    assert padded.sft_step(batch, 1e-3) == pytest.approx(packed.sft_step(batch, 1e-3), rel=1e-12)
    for p, q in zip(padded.params, packed.params):
        assert_close(q, p, rtol=1e-9, atol=1e-12)


# -- validation ------------------------------------------------------------------------------------
def problems_of(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        preflight(overrides)
    return info.value.problems


def test_validation_of_qkv_format():
    assert compose_run([]).train.qkv_format == "bshd"  # the default, once in the schema
    assert any("train.qkv_format='tnd' is not one of ['bshd', 'thd']" in p for p in problems_of(["train.qkv_format=tnd"]))
    probs = problems_of(["train=megatron", "train.qkv_format=thd", "parallelism.pipeline_model_parallel_size=2",
                         "parallelism.sequence_parallel=true"])
    assert any("train.qkv_format=thd with train.backend=megatron" in p and "parallelism.pipeline_model_parallel_size=2, "
               "parallelism.sequence_parallel=true" in p and "set train.qkv_format=bshd" in p for p in probs), probs
    cfg, probs, _ = check(compose_run(["train=megatron", "train.qkv_format=thd"]))
    assert not any("qkv_format" in p for p in probs) and cfg.train.qkv_format == "thd"


def test_thd_turns_prefix_sharing_off_under_transformers():
    cfg = compose_run(["train.qkv_format=thd", "model.model_impl=transformers", "train.prefix_sharing=true"])  # validated
    assert cfg.train.prefix_sharing is False
    cfg.train.prefix_sharing = True
    _, _, notes = check(cfg)
    assert any("train.prefix_sharing turned off" in n and "train.qkv_format=thd" in n for n in notes), notes
    assert compose_run(["model.model_impl=transformers", "train.prefix_sharing=true"]).train.prefix_sharing is True


# -- the megatron backend on the CPU shim (float32) --------------------------------------------------
def megatron_run(cfg, hf, qkv_format: str, algo: AlgorithmConfig, **train_kw) -> dict:
    """One train_rollout of the 4 uneven rows (14, 10, 14, 11 tokens) and the log-probs before and after it."""
    import dataclasses

    from tests.support.megatron_cpu.workers import uneven_batch

    train = dataclasses.replace(cfg.train, qkv_format=qkv_format, skip_zero_advantage_samples=False, **train_kw)
    b = trainers.megatron_backend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, algo, train, 1.0, 10, CPU,
                                  max_response_len=8, seed=cfg.seed)
    b.freeze_reference()
    batch = uneven_batch()
    before = b.compute_log_probs(batch)
    return {"before": before, "metrics": b.train_rollout(batch), "after": b.compute_log_probs(batch),
            "micro_batches": [mb.idx.tolist() for mb in b.runner.micro_batches(batch, torch.arange(4))]}


# Log-probs after the two optimizer steps: packed and padded (or micro-batches of 1 and the token budget) sum the same
# gradients in a different order, and which order rounds how depends on the CPU's BLAS kernels (AVX2 or AVX-512). Adam's
# first steps move a weight by about lr whatever its gradient's size, so a rounding difference in a near-zero gradient
# moves that weight by up to 2 x lr (1e-3 here) either way: measured on an AVX-512 machine, up to 4.4e-5 in the
# log-probs (the AVX2 machines before: under 1e-5). A packing error (a token in the wrong row or position, a wrong
# normalisation) shows in the losses and gradient norms, compared at `tol`, and in the log-probs before the steps.
AFTER_STEPS_TOL = 1e-4


def assert_megatron_same(padded: dict, packed: dict, tag: str, tol: float = 1e-5):
    from tests.support.megatron_cpu.workers import uneven_batch

    real = uneven_batch().attention_mask[:, 1:].bool()
    for key, atol in (("before", tol), ("after", max(tol, AFTER_STEPS_TOL))):
        assert_close(packed[key][real], padded[key][real], rtol=0, atol=atol, msg=lambda m: f"{tag} {key}: {m}")
        assert (packed[key][~real] == 0).all()
    assert padded["metrics"].keys() == packed["metrics"].keys()
    for key, v in padded["metrics"].items():
        if key in ROUTER_FIGURES:  # the routers see each row's L tokens padded and its first L - 1 packed (thd.pack)
            assert abs(packed["metrics"][key] - v) <= 0.05 * abs(v), (tag, key, v, packed["metrics"][key])
            continue
        assert abs(packed["metrics"][key] - v) <= tol * max(1.0, abs(v)), (tag, key, v, packed["metrics"][key])


# the MoE routers' step figures (training/megatron/router_load.py): a padded row's last token, which predicts nothing,
# still goes through the routers, and a packed micro-batch leaves it out, so these two read the same tokens less one per
# row (measured: expert load imbalance 1.628 padded, 1.595 packed); every loss, gradient and log-prob above is exact
ROUTER_FIGURES = ("train/moe_aux_loss", "train/moe_expert_load_imbalance")


MEGATRON_CASES = {
    "token_mean-kl_loss-entropy": dict(loss_aggregation="token_mean", use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01),
    "seq_mean_token_sum": dict(loss_aggregation="seq_mean_token_sum"),
    "seq_mean_token_sum_norm": dict(loss_aggregation="seq_mean_token_sum_norm", grpo_std_normalization=False),
    "sample_token_mean-gspo": dict(advantage_estimator="gspo", eps_clip=3e-4, eps_clip_high=4e-4),
}


@pytest.mark.parametrize("case", list(MEGATRON_CASES))
def test_megatron_packed_equals_padded(case):
    """The tiny dense model, two steps of 2 rows: one micro-batch of both rows per step (packed: 13 + 9 tokens of rows
    0, 1 in one stream; 13 + 10 of rows 2, 3), and the packed token budget 25 against padded micro-batches of 1. The
    budget counts real tokens: each step's two rows, 14 + 10 = 24 and 14 + 11 = 25, train in one micro-batch; the
    log-prob passes over all 4 rows: LPT from k = ceil(49 / 25) = 2, 14 (row 0) | 14 (row 2), 11 (row 3) joins the
    tie's lower bin (25), 10 (row 1) the other (24): [0, 3] [1, 2]."""
    from tests.support.megatron_cpu import shim, workers

    shim.install()
    cfg, _, hf = workers.tiny_setup(["train.micro_batch_size=2"])
    algo = AlgorithmConfig(**MEGATRON_CASES[case])
    padded = megatron_run(cfg, hf, "bshd", algo)
    packed = megatron_run(cfg, hf, "thd", algo)
    assert packed["micro_batches"] == [[0, 1], [2, 3]]
    assert padded["metrics"]["train/grad_norm"] > 0 and padded["metrics"]["train/ppo_kl"] != 0  # step 2 read old log-probs
    assert_megatron_same(padded, packed, case)
    ones = megatron_run(cfg, hf, "bshd", algo, micro_batch_size=1)
    budget = megatron_run(cfg, hf, "thd", algo, micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=25)
    assert budget["micro_batches"] == [[0, 3], [1, 2]] and ones["micro_batches"] == [[0], [1], [2], [3]]
    assert_megatron_same(ones, budget, case)


@pytest.mark.parametrize("family", ["qwen3_moe", "glm4"])
def test_megatron_packed_equals_padded_moe_and_partial_rotary(family, tmp_path):
    """qwen3_moe (routed experts: the packed stream has no padding tokens for the router) and glm4 (rotary on half of
    each head, post norms): packed = padded."""
    import dataclasses

    from tests.support.megatron_cpu import shim, zoo

    shim.install()
    cfg, hf = zoo.build(family, tmp_path)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, num_steps_per_rollout=2, global_batch_size=2,
                                                             micro_batch_size=2, lr=1e-3))
    algo = AlgorithmConfig(loss_aggregation="token_mean")
    assert_megatron_same(megatron_run(cfg, hf, "bshd", algo), megatron_run(cfg, hf, "thd", algo), family)


def test_megatron_thd_rope_equals_megatron_per_sample_rope():
    """model._thd_rope (no host sync) against megatron's own per-sample THD rotary, bit for bit: samples of 3, 0 (an
    empty one), 5 and 1 tokens over freqs of the longest sample (positions restart per sample), partial rotary (the
    last 4 of 16 dims pass through), and megatron's exact-mapping case (freqs over the whole stream: one sample)."""
    from tests.support.megatron_cpu import shim

    shim.install()
    from megatron.core.models.common.embeddings import rope_utils

    from slime_hydra.training.megatron import model as mm

    class OneRank:
        def size(self):
            return 1

        def rank(self):
            return 0

    g = torch.Generator().manual_seed(0)
    t = torch.randn(9, 2, 16, generator=g, dtype=torch.float64)  # [t, heads, dim]
    cu = torch.tensor([0, 3, 3, 8, 9], dtype=torch.int32)
    for freqs, cu_ in ((torch.randn(5, 1, 1, 12, generator=g, dtype=torch.float64), cu),  # longest sample: 5
                       (torch.randn(9, 1, 1, 12, generator=g, dtype=torch.float64), torch.tensor([0, 9], dtype=torch.int32))):
        ours = mm._thd_rope(t, cu_, freqs, cp_group=OneRank())
        theirs = mm._MEGATRON_THD_ROPE(t, cu_, freqs, cp_group=OneRank())
        assert torch.equal(ours, theirs) and not torch.equal(ours, t)
    # by hand: token 1 of sample 2 (stream position 4) takes freqs row 1
    freqs = torch.randn(5, 1, 1, 16, generator=g, dtype=torch.float64)
    one = mm._thd_rope(t, cu, freqs, cp_group=OneRank())[4]
    assert torch.equal(one, rope_utils._apply_rotary_pos_emb_bshd(t[4][None, None], freqs[1:2])[0, 0])


@pytest.mark.integration
def test_megatron_packed_layers_compile_without_graph_breaks_of_their_own(monkeypatch):
    """train.megatron.compile_layers with thd: the packed path (model._thd_rope, SDPAttention._thd's varlen branch) traces
    without a graph break of its own; the only breaks are megatron-core's tp_group deprecation warning (warnings.warn),
    which the padded path has too. On CPU the varlen kernel is stood in for by a traceable dense masked SDPA (the real
    kernel under torch.compile: tests/training/megatron/test_gpu.py); dynamo's aot_eager backend (no C++ compile)."""
    import dataclasses

    from torch._dynamo.utils import counters

    from slime_hydra.training import thd
    from tests.support.megatron_cpu import shim, workers

    shim.install()
    from slime_hydra.training.megatron import model as mm

    def dense(q, k, v, cu, cu_k, max_q, max_k, is_causal=False, scale=None, enable_gqa=False):
        idx = torch.arange(q.shape[0])
        seg = torch.searchsorted(cu.long(), idx, right=True)  # [t] each token's sample
        mask = (seg[:, None] == seg[None, :]) & (idx[:, None] >= idx[None, :])
        out = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(0, 1)[None] for x in (q, k, v)), attn_mask=mask,
                                                               scale=scale, enable_gqa=enable_gqa)
        return out[0].transpose(0, 1)

    monkeypatch.setattr(thd, "VARLEN", thd.Varlen(dense, {"is_causal": True}, True, True))
    monkeypatch.setattr(mm, "varlen_usable", lambda q, scale, dropout, max_seqlen: max_seqlen is not None)
    cfg, _, hf = workers.tiny_setup(["train.micro_batch_size=2"])
    torch._dynamo.reset()
    counters.clear()
    train = dataclasses.replace(cfg.train, qkv_format="thd", skip_zero_advantage_samples=False, num_steps_per_rollout=1)
    b = trainers.megatron_backend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, AlgorithmConfig(), train, 1.0, 10,
                                  CPU, max_response_len=8, seed=cfg.seed)
    for layer in b.gpt.decoder.layers:
        layer.compile(backend="aot_eager")
    b.train_rollout(workers.uneven_batch())  # 2 micro-batches of 22 and 23 packed tokens
    reasons, graphs = list(counters["graph_break"]), counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert graphs > 0  # the layers did compile
    assert all("_warnings.warn" in r for r in reasons), reasons


def test_varlen_signature_forms(monkeypatch):
    """thd.find_varlen reads how this torch's varlen_attn asks for causal attention: is_causal (torch 2.9/2.10, no
    scale, no enable_gqa) or window_size=(-1, 0) (later; scale, and enable_gqa later still); neither: no varlen.
    On CPU the packed attention always takes the per-sample loop."""
    import torch.nn.attention.varlen as varlen

    from slime_hydra.training import thd

    def old(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None): ...

    def new(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
            enable_gqa=False): ...

    def other(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k): ...

    monkeypatch.setattr(varlen, "varlen_attn", old)
    assert thd.find_varlen() == thd.Varlen(old, {"is_causal": True}, False, False)
    monkeypatch.setattr(varlen, "varlen_attn", new)
    assert thd.find_varlen() == thd.Varlen(new, {"window_size": (-1, 0)}, True, True)
    monkeypatch.setattr(varlen, "varlen_attn", other)
    assert thd.find_varlen() is None
    q = torch.zeros(4, 2, 8, dtype=torch.bfloat16)
    assert not thd.varlen_usable(q, None, 0.0, 4)  # CPU


def tp2_main(rank: int, port: int, out_dir: str) -> None:
    import dataclasses
    import os

    from tests.support.megatron_cpu import shim, workers

    shim.install()
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cfg, _, hf = workers.tiny_setup(["train.micro_batch_size=2"])
    cfg = dataclasses.replace(cfg, parallelism=dataclasses.replace(cfg.parallelism, tensor_model_parallel_size=2))
    res = megatron_run(cfg, hf, "thd", AlgorithmConfig(**MEGATRON_CASES["token_mean-kl_loss-entropy"]))
    torch.save(res, os.path.join(out_dir, f"tp2_rank{rank}.pt"))


@pytest.mark.integration
def test_megatron_packed_tp2_equals_padded_tp1(tmp_path):
    """TP=2 (gloo, 2 processes; heads and the vocabulary split, no sequence parallelism), packed, against one process
    padded: the same step."""
    import socket

    from tests.support.megatron_cpu import shim, workers

    shim.install()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    warm_spawn.spawn(tp2_main, args=(port, str(tmp_path)), nprocs=2, join=True)
    cfg, _, hf = workers.tiny_setup(["train.micro_batch_size=2"])
    single = megatron_run(cfg, hf, "bshd", AlgorithmConfig(**MEGATRON_CASES["token_mean-kl_loss-entropy"]))
    for rank in (0, 1):
        assert_megatron_same(single, torch.load(tmp_path / f"tp2_rank{rank}.pt"), f"tp2 rank {rank}", tol=1e-4)


def test_packed_critic_equals_padded():
    """ppo: the critic's values and value loss over packed micro-batches (and its real-token budget) = padded, two
    rollouts (the second's values and advantages come from the trained critics)."""
    algo = AlgorithmConfig(advantage_estimator="ppo", normalize_advantages=True)
    padded = backend(algo, "bshd", micro_batch_size=8, critic_lr=1e-2)
    packed = backend(algo, "thd", micro_batch_size=1, critic_lr=1e-2, use_dynamic_batch_size=True, max_tokens_per_gpu=24)
    for _ in range(2):
        m_pad = padded.train_rollout(trainers.algo_advantages(samples(), algo, 2, TOK.pad_token_id, padded))
        m_pack = packed.train_rollout(trainers.algo_advantages(samples(), algo, 2, TOK.pad_token_id, packed))
        for key in ("train/value_loss", "train/value_grad_norm", "train/values_mean", "train/pg_loss", "train/grad_norm"):
            assert abs(m_pad[key] - m_pack[key]) <= 1e-9 * max(1.0, abs(m_pad[key])), (key, m_pad[key], m_pack[key])
    assert m_pad["train/values_mean"] != 0  # the critic trained
    for p, q in zip(padded.critic.model.parameters(), packed.critic.model.parameters()):
        assert_close(q, p, rtol=1e-9, atol=1e-12)
