"""Expert parallelism on CPU ranks over gloo: the tiny MoE (4 experts, top-2) with EP=2 (2 ranks: each holds 2 experts,
tokens cross ranks by megatron's alltoall dispatcher) and TP=2 × EP=2 with sequence parallelism (4 ranks) gives the
single process's numbers: log-probs, the first step's train metrics (the routers' load-balancing loss and expert load
included), and the Hugging Face export after it (one step), where every expert is gathered to its global name. A checkpoint written
under EP resumes bit-exact (megatron's sharded experts by global index)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.support.megatron_cpu import experts, shim, workers
from tests.support.servers import free_port

KEYS = ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy", "train/moe_aux_loss",
        "train/moe_expert_load_imbalance")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    shim.install()
    out = tmp_path_factory.mktemp("ep1")
    cfg, _, hf = workers.tiny_setup(experts.MOE)
    return experts.moe_run(cfg, hf, {}, str(out), "ep1"), out


@pytest.mark.integration
@pytest.mark.parametrize("name", list(experts.LAYOUTS))
def test_expert_parallel_equals_one_process_and_resumes_bit_exact(name, one_process, tmp_path):
    one, one_dir = one_process
    ranks = experts.LAYOUTS[name][0]
    torch.multiprocessing.spawn(experts.moe_spawn_main, args=(ranks, free_port(), str(tmp_path), name), nprocs=ranks, join=True)
    mask = workers.fixed_batch().loss_mask.bool()
    assert one["metrics"]["train/moe_aux_loss"] > 0 and one["metrics"]["train/moe_expert_load_imbalance"] >= 1
    for rank in range(ranks):
        got = torch.load(tmp_path / f"{name}_rank{rank}.pt")
        assert (got["before"][mask] - one["before"][mask]).abs().max() < 1e-5, rank
        for key in KEYS:
            assert got["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-6), (rank, key)
        for key in KEYS:  # the resumed run repeats the uninterrupted second rollout bit for bit
            assert got["resumed_metrics2"][key] == got["metrics2"][key], (rank, key)
        assert torch.equal(got["resumed_after2"], got["after2"]), rank
    ours, ref = load_file(tmp_path / f"{name}_hf" / "model.safetensors"), load_file(one_dir / "ep1_hf" / "model.safetensors")
    assert sorted(ours) == sorted(ref) and "model.layers.1.mlp.experts.3.down_proj.weight" in ours
    for k, t in ref.items():  # an Adam step at lr 1e-3: an element whose gradient is near zero may move by a fraction
        diff = (ours[k] - t).abs()  # of a step (lr × g / (sqrt(v) + eps)) on fp32 rounding; the rest to ~1e-8
        assert diff.max() < 1e-4 and diff.mean() < 1e-7, (k, float(diff.max()), float(diff.mean()))


@pytest.mark.integration
def test_an_ep_rank_without_rows_completes_the_step_with_the_single_process_numbers(tmp_path):
    """One kept row of four: at EP=2 (DP=2) one rank has no rows. It runs a zeroed micro-batch, which its MoE layers
    need (each exchanges tokens with the other rank) and which the routers take as padding: no loss, no gradient, no
    load-balancing loss or expert load of its own."""
    shim.install()
    cfg, _, hf = workers.tiny_setup([*experts.MOE, *workers.ONE_KEPT])
    one = workers.one_kept_run(cfg, hf, {})
    assert one["metrics"]["train/kept_samples"] == 1.0 and one["metrics"]["train/moe_aux_loss"] > 0
    torch.multiprocessing.spawn(experts.one_kept_spawn_main, args=(2, free_port(), str(tmp_path), "ep2"), nprocs=2, join=True)
    mask = workers.fixed_batch().loss_mask.bool()
    for rank in (0, 1):
        got = torch.load(tmp_path / f"one_kept_ep2_rank{rank}.pt")
        for key in (*KEYS, "train/kept_samples"):
            assert got["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-6), (rank, key)
        assert (got["after"][mask] - one["after"][mask]).abs().max() < 1e-5, rank
