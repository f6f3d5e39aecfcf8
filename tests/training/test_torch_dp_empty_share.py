"""Every torch data-parallel rank takes part in every step: with one sample kept of a step's 32
(train.skip_zero_advantage_samples), DP=2 leaves rank 1 no rows. It still joins the step's collectives (the loss
denominators, the gradient all-reduce) with zeros, so the step completes at once and the merged metrics and the weights
are the single process's, as under train=megatron (tests/training/megatron/test_empty_share.py)."""

from __future__ import annotations

import time

import pytest
import torch

from slime_hydra.orchestration.train_group import merge_metrics
from tests.support import torch_ranks, warm_spawn
from tests.support.servers import free_port

DEADLINE_S = 180  # the spawn, the imports and one step take 20-65 s here; a rank left waiting would never finish


@pytest.mark.integration
def test_a_torch_dp_rank_without_rows_completes_the_step_with_the_single_process_numbers(tmp_path):
    one, before, ref = torch_ranks.one_kept_single()
    assert one["train/kept_samples"] == 1.0 and one["train/grad_norm"] > 0
    assert max((a - b).abs().max().item() for a, b in zip(ref, before)) > 1e-3  # the step moved the weights (lr 1e-2)
    ctx = warm_spawn.spawn(torch_ranks.one_kept_rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2,
                                      join=False)
    t0 = time.monotonic()
    while not ctx.join(timeout=2):
        if time.monotonic() - t0 > DEADLINE_S:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the DP=2 step with one kept sample did not finish in {DEADLINE_S} s: a rank is left waiting")
    got = [torch.load(tmp_path / f"one_kept_rank{r}.pt") for r in (0, 1)]
    assert got[1]["metrics"]["train/kept_samples"] == 0.0 and "train/pg_loss" not in got[1]["metrics"]  # no rows
    merged = merge_metrics([g["metrics"] for g in got])
    assert merged.keys() == one.keys()  # train/loss, pg_loss, grad_norm, entropy, kept_samples, lr, ...
    for key in one:
        assert merged[key] == pytest.approx(one[key], rel=1e-4, abs=1e-7), key
    for rank in (0, 1):
        assert max((a - b).abs().max().item() for a, b in zip(got[rank]["params"], ref)) < 1e-5, rank
    assert max((a - b).abs().max().item() for a, b in zip(got[0]["params"], got[1]["params"])) == 0.0  # ranks agree
