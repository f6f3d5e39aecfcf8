"""model.model_impl=native: the packed forward gives transformers' logits and gradients (training) and
the same tokens and log-probs (decoding), for Qwen3 (qk-norm) and Llama blocks with grouped-query
attention; validation refuses models it does not implement (auto falls back to transformers for them).

transformers' RMSNorm computes in float32 even in a float64 model, the native one in the model's dtype,
so in float64 the two agree to float32 round-off (~1e-7 relative): the tolerances below. A wrong
mask, position or head grouping is off by O(1e-2) or more (checked: `test_tolerance_is_not_blind`).
"""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import torch
from torch.testing import assert_close

from slime_hydra.algorithms.losses import log_probs_from_logits
from slime_hydra.config.schema import AlgorithmConfig, ModelConfig, TrainConfig
from slime_hydra.errors import ConfigError
from slime_hydra.models.build import build_model
from slime_hydra.rollout.local import LocalRollout
from slime_hydra.training.batch import collate
from slime_hydra.training.packed import packed_logits
from slime_hydra.types import Sample, SamplingParams, Status
from tests.support.tiny import TOK, samples
from tests.support.trainers import torch_backend

CPU = torch.device("cpu")


def tiny(architecture: str = "qwen3", seed: int = 0) -> torch.nn.Module:
    cfg = ModelConfig(architecture=architecture, num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4,
                      num_query_groups=2, kv_channels=8, dtype="float32", init_std=0.3)  # far from uniform logits
    return build_model(cfg, TOK, seed).double()


def ragged_batch():
    """samples(): 4 prompts x 2, ragged prompt/response lengths, a masked first response token (row 4),
    plus a multi-turn-like row with a hole in its mask and a row with nothing trained."""
    ss = samples()
    p = TOK.encode("3+4=")
    r = TOK.encode("7, ok") + [TOK.eos_token_id]
    ss.append(Sample(prompt="3+4=", prompt_tokens=p, tokens=p + r, response_length=len(r), loss_mask=[1, 0, 0, 1, 1, 1]))
    ss.append(Sample(prompt="3+4=", prompt_tokens=p, tokens=p + r[:2], response_length=2, loss_mask=[0, 0]))
    batch = collate(ss, torch.zeros(len(ss)), TOK.pad_token_id)
    batch.loss_mask = batch.loss_mask.double()
    return batch


def loss_and_grads(model, batch, native: bool, share_prefix: bool = True):
    model.zero_grad(set_to_none=True)
    if native:
        logits = packed_logits(model, batch.input_ids, batch.attention_mask, batch.loss_mask, share_prefix)
    else:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    logp = log_probs_from_logits(logits, batch.input_ids[:, 1:])  # [n, T]
    weights = torch.linspace(0.5, 2.0, logp.numel(), dtype=logp.dtype).view_as(logp)  # any per-token weighting
    (logp * weights * batch.loss_mask).sum().backward()
    return logits.detach(), logp.detach() * batch.loss_mask, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
@pytest.mark.parametrize("share_prefix", [True, False])
def test_packed_logits_and_gradients_match_transformers(architecture, share_prefix):
    model, batch = tiny(architecture), ragged_batch()
    _, ref_lp, ref_g = loss_and_grads(model, batch, native=False)
    logits, lp, g = loss_and_grads(model, batch, native=True, share_prefix=share_prefix)
    assert_close(lp, ref_lp, rtol=1e-6, atol=1e-6)
    assert logits[batch.loss_mask == 0].abs().max() == 0  # off the mask: the padding slot
    for name in ref_g:
        scale = ref_g[name].abs().max().item()
        assert_close(g[name], ref_g[name], rtol=1e-5, atol=1e-5 * scale, msg=name)


def test_tolerance_is_not_blind():
    """A 1% change of one weight, or a wrong head grouping, moves the log-probs far past the tolerance
    (the model's log-probs spread over several nats, so they are not a constant function)."""
    model, batch = tiny(), ragged_batch()
    _, ref_lp, _ = loss_and_grads(model, batch, native=False)
    trained = ref_lp[batch.loss_mask > 0]
    assert trained.max() - trained.min() > 1.0
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.model.layers[0].self_attn.v_proj.weight.mul_(1.01)
    _, lp, _ = loss_and_grads(other, batch, native=True)
    assert (lp - ref_lp).abs().max() > 1e-4
    swapped = copy.deepcopy(model)  # kv heads swapped: what a wrong query-to-kv grouping would compute
    with torch.no_grad():
        for proj in (swapped.model.layers[0].self_attn.k_proj, swapped.model.layers[0].self_attn.v_proj):
            proj.weight.copy_(proj.weight.view(2, 8, -1).flip(0).reshape_as(proj.weight))
    _, lp, _ = loss_and_grads(swapped, batch, native=True)
    assert (lp - ref_lp).abs().max() > 1e-3


def prompts(n_per: int = 3) -> list[Sample]:
    texts = ["12+34=", "5+5=", "7+8=", "100+1="]  # ragged context lengths
    return [Sample(prompt=t, prompt_tokens=TOK.encode(t)) for t in texts for _ in range(n_per)]


def decode(model, impl: str, ss: list[Sample], sp: SamplingParams, seed: int = 0) -> list[Sample]:
    asyncio.run(LocalRollout(model, TOK, seed=seed, model_impl=impl).generate(ss, sp))
    return ss


@pytest.mark.parametrize("architecture", ["qwen3", "llama"])
def test_packed_decoder_matches_transformers(architecture):
    model = tiny(architecture, seed=1)
    greedy = SamplingParams(top_k=1, max_new_tokens=7, stop_token_ids=(TOK.eos_token_id,))
    ref, out = decode(model, "transformers", prompts(), greedy), decode(model, "native", prompts(), greedy)
    assert [s.tokens for s in out] == [s.tokens for s in ref]
    assert [s.status for s in out] == [s.status for s in ref]
    for a, b in zip(out, ref):
        assert_close(torch.tensor(a.rollout_log_probs), torch.tensor(b.rollout_log_probs), rtol=0, atol=1e-6)
    # sampling at temperature 1: the same generator draws over (almost) the same probabilities
    sp = SamplingParams(max_new_tokens=7, stop_token_ids=(TOK.eos_token_id,))
    ref, out = decode(model, "transformers", prompts(), sp, seed=5), decode(model, "native", prompts(), sp, seed=5)
    assert [s.tokens for s in out] == [s.tokens for s in ref]


def test_packed_decoder_continues_partial_samples_and_stops_finished_rows():
    """Rows with different budgets (partial responses) and rows that stop early: every row ends where the
    transformers decoder ends it, and a finished row's cache is never written again."""
    model = tiny(seed=2)
    sp = SamplingParams(top_k=1, max_new_tokens=6, stop_token_ids=(TOK.eos_token_id,))

    def partial() -> list[Sample]:
        ss = prompts(2)
        for s, k in zip(ss, [0, 1, 2, 3, 5, 0, 4, 6]):
            s.tokens, s.response_length = s.prompt_tokens + TOK.encode("9876543")[:k], k
            s.rollout_log_probs, s.loss_mask, s.status = [-1.0] * k, [1] * k, Status.ABORTED
        return ss

    ref, out = decode(model, "transformers", partial(), sp), decode(model, "native", partial(), sp)
    assert [s.tokens for s in out] == [s.tokens for s in ref]
    assert [s.response_length for s in out] == [s.response_length for s in ref]
    assert all(s.response_length <= 6 for s in out)


def test_trainer_step_matches_transformers():
    """One GRPO rollout through TorchTrainBackend: the same metrics and (clipped) gradients either way.
    (Not the updated weights: AdamW's first step moves every weight by ~lr * sign(grad), so a weight whose
    gradient is float round-off moves either way.)"""
    batch = ragged_batch()
    batch.advantages = torch.linspace(-1, 1, batch.num_samples, dtype=torch.float64)[:, None] * batch.loss_mask
    train = TrainConfig(micro_batch_size=5, global_batch_size=10, num_steps_per_rollout=1, lr=1e-2, clip_grad=1.0)
    backends = {impl: torch_backend(tiny(), AlgorithmConfig(), train, 1.0, 10, CPU, model_impl=impl)
                for impl in ("transformers", "native")}
    metrics = {impl: b.train_rollout(copy.deepcopy(batch)) for impl, b in backends.items()}
    for key in ("train/pg_loss", "train/entropy", "train/grad_norm"):
        assert metrics["native"][key] == pytest.approx(metrics["transformers"][key], rel=1e-5), key
    ref = dict(backends["transformers"].model.named_parameters())
    for name, p in backends["native"].model.named_parameters():
        scale = ref[name].grad.abs().max().item()
        assert_close(p.grad, ref[name].grad, rtol=1e-5, atol=1e-5 * scale, msg=name)


def test_validation_refuses_models_native_does_not_run(tmp_path):
    from slime_hydra.app.preflight import compose_run

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "attention_bias": True, "hidden_act": "silu"}))
    with pytest.raises(ConfigError) as e:
        compose_run([f"model.hf_checkpoint={tmp_path}", "model.model_impl=native"])
    msg = str(e.value)
    assert "model.model_impl=native" in msg and "qwen2" in msg and "attention_bias=true" in msg
    assert "set model.model_impl=transformers" in msg
    with pytest.raises(ConfigError, match=r"model.model_impl='fast' is not one of \['transformers', 'native', 'auto'\]"):
        compose_run(["model.model_impl=fast"])


def test_auto_resolves_at_validation():
    """The embedded default's model.model_impl=auto: native for its Qwen3; a MoE or qwen2 model option falls back
    to transformers; an HF checkpoint is judged by its config.json."""
    from slime_hydra.app.preflight import compose_run

    assert compose_run([]).model.model_impl == "native"
    assert compose_run(["model=qwen3_30b_a3b"]).model.model_impl == "transformers"
    assert compose_run(["model=qwen2_5_7b"]).model.model_impl == "transformers"
    assert compose_run(["model=llama3_8b"]).model.model_impl == "transformers"  # llama3.1 rope scaling
    assert compose_run(["model=qwen3_4b"]).model.model_impl == "native"
