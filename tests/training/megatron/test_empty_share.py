"""Every data-parallel rank takes part in every step: with one sample kept of a step's four
(train.skip_zero_advantage_samples), DP=2 leaves one rank no rows. That rank runs one row with a zero loss mask
(MegatronRunner.share_micro_batches), so the step's gradient reduction and metric sums complete at once and give the
single process's numbers; without it the other rank waited in the reduction until cluster.distributed_timeout_s."""

from __future__ import annotations

import time

import pytest
import torch

from tests.support import warm_spawn
from tests.support.megatron_cpu import shim, workers
from tests.support.servers import free_port

DEADLINE_S = 180  # the spawn, the imports and one step take ~20 s here; a rank left waiting would never finish


@pytest.mark.integration
def test_a_dp_rank_without_rows_completes_the_step_with_the_single_process_numbers(tmp_path):
    shim.install()
    cfg, _, hf = workers.tiny_setup(workers.ONE_KEPT)
    one = workers.one_kept_run(cfg, hf, {})
    assert one["metrics"]["train/kept_samples"] == 1.0 and one["metrics"]["train/grad_norm"] > 0
    ctx = warm_spawn.spawn(workers.one_kept_spawn_main, args=(2, free_port(), str(tmp_path), ["dp2"]),
                                      nprocs=2, join=False)
    deadline = time.monotonic() + DEADLINE_S
    while not ctx.join(timeout=2):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the DP=2 step with one kept sample did not finish in {DEADLINE_S} s: a rank is left waiting")
    mask = workers.fixed_batch().loss_mask.bool()
    for rank in (0, 1):
        got = torch.load(tmp_path / f"one_kept_dp2_rank{rank}.pt")
        for key in ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy", "train/kept_samples"):
            assert got["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-7), (rank, key)
        assert (got["after"][mask] - one["after"][mask]).abs().max() < 1e-5, rank
