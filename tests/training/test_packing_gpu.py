"""On the GPU (marker gpu; run on the device machine): the transformers path's packed attention (train.qkv_format=thd
with train.backend=torch) takes torch's varlen flash kernel, once per layer, and its log-probs are as close to a
float32 reference as the same model's own bf16 attention run on each sample alone; samples stay isolated."""

from __future__ import annotations

import copy

import pytest
import torch

from slime_hydra.algorithms import losses as L
from slime_hydra.training import thd

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_transformers_packed_attention_takes_varlen_and_keeps_bf16_accuracy(monkeypatch):
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.config.store import register
    from slime_hydra.models.build import build_model, build_tokenizer

    calls = []
    real = thd.causal_varlen_attention
    monkeypatch.setattr(thd, "causal_varlen_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    register()
    # the tiny Qwen3 widened (as tests/training/megatron/test_gpu.py): 4 layers, d=512, 8 heads / 4 groups, head dim 64
    cfg = compose_run(["model.dtype=bfloat16", "model.hidden_size=512", "model.ffn_hidden_size=1536",
                       "model.num_attention_heads=8", "model.num_query_groups=4", "model.kv_channels=64"])
    tok = build_tokenizer(cfg.model)
    model = build_model(cfg.model, tok, cfg.seed).cuda().eval()
    ref = copy.deepcopy(model).float()  # the same bf16-representable weights, computed in float32
    lengths = [37, 5, 120, 64]
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(3, len(tok), (n,), generator=g)
        attn[i, :n] = 1
    ids, attn = ids.cuda(), attn.cuda()

    def packed(x):
        p = thd.pack(x, attn)
        return thd.unpack(L.log_probs_from_logits(thd.thd_logits(model, p).float(), p.targets), p)

    def alone(m, i):
        n = lengths[i]
        return L.log_probs_from_logits(m(input_ids=ids[i : i + 1, :n]).logits[0, :-1].float(), ids[i, 1:n])

    with torch.no_grad():
        got = packed(ids)
        assert len(calls) == cfg.model.num_layers  # one varlen launch per layer for the whole packed stream
        errs = []
        for i, n in enumerate(lengths):
            want = alone(ref, i)
            errs.append((float((got[i, : n - 1] - want).abs().max()), float((alone(model, i) - want).abs().max())))
        print("packed vs float32, bf16 alone vs float32 (max |diff| per sample):", errs)
        for packed_err, bf16_err in errs:
            assert packed_err <= 2 * bf16_err + 2**-8, errs
        changed = ids.clone()
        changed[0, 1 : lengths[0]] = changed[0, 1 : lengths[0]].flip(0)
        other = packed(changed)
        assert float((other[1:] - got[1:]).abs().max()) <= 1e-3  # the other samples do not see sample 0
        assert float((other[0] - got[0]).abs().max()) > 1e-2
