"""The KL loss with pipeline stages: a micro-batch's loss runs on the last stage, which holds only the reference's last
layers, so the trainer takes the rollout's reference log-probs through the whole pipeline first
(MegatronTrainBackend.reference_log_probs). PP=2 over gloo gives the single process's numbers."""

from __future__ import annotations

import pytest
import torch

from tests.support import warm_spawn
from tests.support.megatron_cpu import shim, workers
from tests.support.servers import free_port


@pytest.mark.integration
def test_kl_loss_with_two_pipeline_stages_equals_one(tmp_path):
    shim.install()
    cfg, _, hf = workers.tiny_setup(workers.KL)
    one = workers.kl_run(cfg, hf, {})
    warm_spawn.spawn(workers.kl_spawn_main, args=(2, free_port(), str(tmp_path), ["pp2"]), nprocs=2, join=True)
    last = torch.load(tmp_path / "kl_pp2_rank1.pt")  # the metrics live on the last stage
    # rollout 1's first step is at the reference: KL 0; after it the policy has moved, and the KL term with it
    assert one["metrics"][1]["train/kl_loss"] > 1e-4, one["metrics"]
    for r in (0, 1):
        for key in ("train/kl_loss", "train/loss", "train/pg_loss", "train/grad_norm"):
            assert last["metrics"][r][key] == pytest.approx(one["metrics"][r][key], rel=1e-4, abs=1e-7), (r, key)
    mask = workers.fixed_batch().loss_mask.bool()
    for rank in (0, 1):  # both stages end with the same policy (log-probs broadcast from the last stage)
        got = torch.load(tmp_path / f"kl_pp2_rank{rank}.pt")
        assert (got["after"][mask] - one["after"][mask]).abs().max() < 1e-4, rank
