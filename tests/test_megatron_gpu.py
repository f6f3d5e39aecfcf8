"""On the GPU (marker gpu; run on the device machine): bf16 logits parity with transformers, exact export."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_logits_match_transformers_and_export_is_exact(tmp_path):
    from transformers import AutoModelForCausalLM

    from slime_hydra.algorithms.losses import log_probs_from_logits
    from slime_hydra.config.preflight import compose_run
    from slime_hydra.config.store import register
    from slime_hydra.models.build import build_model, build_tokenizer
    from slime_hydra.training.megatron.backend import MegatronTrainBackend
    from tests.megatron_cpu.workers import fixed_batch

    register()
    # the tiny Qwen3 widened to a "small" one: 4 layers, d=512, 8 heads / 4 groups, head dim 64, bf16
    cfg = compose_run(["train=megatron", "model.dtype=bfloat16", "model.hidden_size=512", "model.ffn_hidden_size=1536",
                       "model.num_attention_heads=8", "model.num_query_groups=4", "model.kv_channels=64"])
    tok = build_tokenizer(cfg.model)
    hf = build_model(cfg.model, tok, cfg.seed).cuda().eval()
    ref_sd = {k: v.clone() for k, v in hf.state_dict().items()}
    b = MegatronTrainBackend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, cfg.algorithm, cfg.train, 1.0, 10,
                             torch.device("cuda"), seed=cfg.seed)
    batch = fixed_batch()
    ids = batch.input_ids[:3, :11].cuda()  # full-length rows (no padding)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits.float()
        pos = torch.arange(ids.shape[1], device="cuda").expand_as(ids)
        ours = b.gpt(input_ids=ids, position_ids=pos, attention_mask=None).float()[..., : ref.shape[-1]]
    diff = (ours - ref).abs().max().item()
    lp_diff = (log_probs_from_logits(ours[:, :-1], ids[:, 1:]) - log_probs_from_logits(ref[:, :-1], ids[:, 1:])).abs().max().item()
    print(f"\nGPU bf16 parity: logits max|diff|={diff:.4g} (logit scale max|ref|={ref.abs().max().item():.3g}), "
          f"log-probs max|diff|={lp_diff:.4g}")
    assert diff < 0.1 and lp_diff < 0.1  # bf16: 8 mantissa bits, a few roundings per layer
    b.save_hf(str(tmp_path / "hf"))
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.bfloat16).state_dict()
    exact = all(torch.equal(back[k].cuda(), ref_sd[k]) for k in ref_sd)
    print(f"GPU Megatron->HF round trip exact: {exact} ({len(ref_sd)} tensors)")
    assert exact
