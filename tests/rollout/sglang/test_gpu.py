"""On the GPU (marker gpu): weight sync over an NCCL update group to a disaggregated SGLang engine.

NCCL refuses two ranks on one device, so the trainer's tensors sit on cuda:0 and the engine on cuda:1
(`rollout.sglang.base_gpu_id=1`); on CPU the same path runs over gloo (tests/rollout/sglang/test_backend.py).
Run on a machine with two GPUs: pytest -q -m gpu tests/rollout/sglang/test_gpu.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.sglang]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (NCCL: one rank per device)")
def test_distributed_sync_over_nccl_makes_the_engine_equal_the_trainer(tmp_path):
    from slime_hydra.app.build import build_rollout
    from slime_hydra.app.preflight import compose_run
    from slime_hydra.models.build import build_model, build_tokenizer
    from slime_hydra.protocols import InProcessWeights
    from slime_hydra.rollout.sglang import weights as W

    cfg = compose_run(["rollout=sglang", "cluster.device=cuda", "cluster.colocate=false", "cluster.rollout_num_gpus=1",
                       "+rollout.sglang.base_gpu_id=1", "+rollout.sglang.skip_tokenizer_init=true",
                       "rollout.sglang.mem_fraction_static=0.3", "logger=none"])
    tok = build_tokenizer(cfg.model)
    model = build_model(cfg.model, tok, cfg.seed).cuda()
    r = build_rollout(cfg, model, tok, str(tmp_path))
    try:
        assert r.mode == "distributed"
        named = [(n, t.detach() + 0.25) for n, t in model.state_dict().items()]  # differs from what the engine loaded
        r.update_weights(InProcessWeights.of(named), version=1)
        assert r._groups[0].backend == "nccl"
        e = r.group.engines[0]
        assert W.check_equal(e.endpoint, named, cfg.model.dtype, 120) == len(named)
        m = r.metrics()
        assert m["perf/weight_sync_send_s"] > 0 and m["rollout/weight_sync_requests"] >= 1
    finally:
        r.shutdown()
