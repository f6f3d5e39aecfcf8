"""The shared-prefix forward gives the plain forward's logits on every trained position, and the same
gradients, in float64: groups sharing a prompt, rows with a masked first response token, ragged lengths."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from slime_hydra.algorithms.losses import log_probs_from_logits
from slime_hydra.training.batch import collate
from slime_hydra.training.prefix import shared_prefix_logits, split_points
from tests.support.tiny import TOK, base_model, samples


def test_split_points():
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0]])
    assert split_points(mask).tolist() == [2, 1, 0]


def loss_and_grads(model, batch, shared: bool):
    model.zero_grad(set_to_none=True)
    if shared:
        logits = shared_prefix_logits(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
    else:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    logp = log_probs_from_logits(logits, batch.input_ids[:, 1:])  # [n, T]
    weights = torch.linspace(0.5, 2.0, logp.numel(), dtype=logp.dtype).view_as(logp)  # any per-token weighting
    loss = (logp * weights * batch.loss_mask).sum()
    loss.backward()
    return logp.detach() * batch.loss_mask, loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_shared_prefix_forward_is_exact(attn_implementation):
    model = base_model()  # float64
    model.config._attn_implementation = attn_implementation
    ss = samples()  # 4 prompts x 2 samples, different prompt and response lengths, one masked first token
    batch = collate(ss, torch.zeros(len(ss)), TOK.pad_token_id)
    batch.loss_mask = batch.loss_mask.double()
    plain_lp, plain_loss, plain_g = loss_and_grads(model, batch, shared=False)
    shared_lp, shared_loss, shared_g = loss_and_grads(model, batch, shared=True)
    # transformers' RMSNorm computes in float32 even in a float64 model, so batch composition shows at
    # float32 round-off: log-probs to ~1e-9, and a prefix's gradient summed over its rows before the norm's
    # backward differs from the per-row sum by ~1e-7 of its scale (a wrong gradient would be off by O(1))
    assert_close(shared_lp, plain_lp, rtol=0, atol=1e-8)
    assert abs(shared_loss - plain_loss) < 1e-7
    for name in plain_g:
        scale = plain_g[name].abs().max().item()
        assert_close(shared_g[name], plain_g[name], rtol=1e-6, atol=1e-6 * scale, msg=name)


def test_no_shared_prompt_falls_back_to_the_plain_forward():
    model = base_model()
    ss = samples()[::2]  # one sample per prompt: nothing to share
    batch = collate(ss, torch.zeros(len(ss)), TOK.pad_token_id)
    out = shared_prefix_logits(model, batch.input_ids, batch.attention_mask, batch.loss_mask)
    plain = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    assert torch.equal(out, plain)
