"""Expert parallelism on CPU ranks over gloo: the tiny MoE (4 experts, top-2) with EP=2 (2 ranks: each holds 2 experts,
tokens cross ranks by megatron's alltoall dispatcher) and TP=2 × EP=2 with sequence parallelism (4 ranks), the ranks
placed as a run places them (Ray actors of orchestration/megatron_group.py on the session's cluster), gives the single
process's numbers on every rank: log-probs, the first step's train metrics (the routers' load-balancing loss and expert
load included), and the Hugging Face export after it (one step), where every expert is gathered to its global name. A
checkpoint written under EP resumes bit-exact (megatron's sharded experts by global index) into a fresh trainer on
the ranks. A rank whose data-parallel share is empty completes the step with the single process's numbers."""

from __future__ import annotations

import contextlib

import pytest
import torch
from safetensors.torch import load_file

from tests.support.megatron_cpu import experts, ray_ranks, shim, workers

pytestmark = pytest.mark.integration  # starts Ray-placed megatron ranks: not in `make test-fast`

KEYS = ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy", "train/moe_aux_loss",
        "train/moe_expert_load_imbalance")


@pytest.fixture(scope="module")
def ranks(ray_head):
    """ranks(name): the Ray-placed ranks of experts.LAYOUTS[name], started when a test first asks and kept for the
    tests that follow on the same layout, each of which sets up its own trainer there (starting the ranks takes
    longer than a test's steps); one layout's ranks at a time. This process joins the session's cluster, every worker
    process of this job installing the CPU shim first."""
    import ray

    ray_ranks.join_with_shim(ray_head, "expert_parallel")
    held: dict[str, object] = {}
    with contextlib.ExitStack() as stack:
        def get(name: str):
            if name not in held:
                stack.close()  # the previous layout's ranks shut down, their placement group removed
                held.clear()
                held[name] = stack.enter_context(ray_ranks.megatron_group(experts.ray_config(name)))
            return held[name]
        yield get
    ray.shutdown()


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    shim.install()
    out = tmp_path_factory.mktemp("ep1")
    cfg, _, hf = workers.tiny_setup(experts.MOE)
    return experts.moe_run(cfg, hf, {}, str(out), "ep1"), out


# first in the module: it shares the EP=2 ranks with the EP=2 case below
def test_an_ep_rank_without_rows_completes_the_step_with_the_single_process_numbers(ranks):
    """One kept row of four: at EP=2 (DP=2) one rank has no rows. It runs a zeroed micro-batch, which its MoE layers
    need (each exchanges tokens with the other rank) and which the routers take as padding: no loss, no gradient, no
    load-balancing loss or expert load of its own."""
    shim.install()
    cfg, _, hf = workers.tiny_setup([*experts.MOE, *workers.ONE_KEPT])
    one = workers.one_kept_run(cfg, hf, {})
    assert one["metrics"]["train/kept_samples"] == 1.0 and one["metrics"]["train/moe_aux_loss"] > 0
    got = experts.one_kept_ray_run(ranks("ep2"), experts.ray_config("ep2", workers.ONE_KEPT))
    assert len(got) == 2
    mask = workers.fixed_batch().loss_mask.bool()
    for rank in (0, 1):
        for key in (*KEYS, "train/kept_samples"):
            assert got[rank]["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-6), (rank, key)
        assert (got[rank]["after"][mask] - one["after"][mask]).abs().max() < 1e-5, rank


@pytest.mark.parametrize("name", list(experts.LAYOUTS))
def test_expert_parallel_ray_ranks_equal_one_process_and_resume_bit_exact(name, ranks, one_process, tmp_path):
    one, one_dir = one_process
    cfg = experts.ray_config(name)
    assert (cfg.cluster.actor_num_gpus_per_node, cfg.parallelism.expert_model_parallel_size) == (experts.LAYOUTS[name][0], 2)
    per_rank, weights = experts.moe_ray_run(ranks(name), cfg, str(tmp_path), name)
    assert len(per_rank) == experts.LAYOUTS[name][0]
    mask = workers.fixed_batch().loss_mask.bool()
    assert one["metrics"]["train/moe_aux_loss"] > 0 and one["metrics"]["train/moe_expert_load_imbalance"] >= 1
    for rank, got in enumerate(per_rank):
        assert (got["before"][mask] - one["before"][mask]).abs().max() < 1e-5, rank
        for key in KEYS:
            assert got["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-4, abs=1e-6), (rank, key)
        for key in KEYS:  # the resumed run repeats the uninterrupted second rollout bit for bit
            assert got["resumed_metrics2"][key] == got["metrics2"][key], (rank, key)
        assert torch.equal(got["resumed_after2"], got["after2"]), rank
    ours, ref = load_file(tmp_path / f"{name}_hf" / "model.safetensors"), load_file(one_dir / "ep1_hf" / "model.safetensors")
    assert sorted(ours) == sorted(ref) and "model.layers.1.mlp.experts.3.down_proj.weight" in ours
    assert sorted(weights) == sorted(ours) and all(torch.equal(weights[k], t) for k, t in ours.items())  # local engines' weights
    for k, t in ref.items():  # an Adam step at lr 1e-3: an element whose gradient is near zero may move by a fraction
        diff = (ours[k] - t).abs()  # of a step (lr × g / (sqrt(v) + eps)) on fp32 rounding; the rest to ~1e-8
        assert diff.max() < 1e-4 and diff.mean() < 1e-7, (k, float(diff.max()), float(diff.mean()))
