"""Token-budget micro-batches (train.use_dynamic_batch_size, training/microbatch.py).

Hand-derived partitions of small cases; random properties (every sample once, every micro-batch within
the budget unless it is one oversized sample, max cost - min cost <= the longest sample, deterministic);
split invariance: the torch backend (float64) and its critic give the same step with dynamic micro-batches
as with fixed ones; the megatron backend on the CPU shim likewise (float32 tolerance).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from torch.testing import assert_close

from slime_hydra.app.preflight import compose_run, preflight
from slime_hydra.config.schema import AlgorithmConfig, TrainConfig
from slime_hydra.errors import ConfigError
from slime_hydra.training.microbatch import micro_batch_cost, micro_batch_indices, partition_by_tokens
from slime_hydra.training.torch_backend import TorchTrainBackend
from tests.support import trainers, warm_spawn
from tests.support.runs import run_cli
from tests.support.tiny import CPU, MAX_LEN, TOK, base_model, make_batch, samples

torch.set_num_threads(1)


# -- the partition ------------------------------------------------------------------------------
def test_packed_cost_hand():
    # lengths [5, 3, 2, 2], budget 6, packed (cost = sum). Lower bound k = ceil(12 / 6) = 2.
    # k=2, longest first: 5 -> bin0 (5), 3 -> bin1 (3), 2 -> cheapest bin1 (5), the last 2 -> cheapest
    # bin0 (5, lower number on the tie): 7 > 6, and bin1 too: fail. k=3: 5, 3, 2 open a bin each, the last 2
    # joins the cheapest (the 2): costs 5, 3, 4. Two bins cannot do: 5 fits with nothing above 1, 3+2+2 = 7.
    assert partition_by_tokens([5, 3, 2, 2], 6, padded=False) == [[0], [1], [2, 3]]


def test_padded_cost_hand():
    # lengths [4, 4, 2, 2, 1], budget 8, padded (cost = rows x longest), longest first. Greedy runs under 8:
    # [4, 4] (2 x 4 = 8) then [2, 2, 1] (3 x 2 = 6): k = 2. The lowest cap that keeps 2 runs: under 8, the 4s part
    # ([4] [4] [2, 2, 1]: 3 runs), so 8: costs 8 and 6.
    assert partition_by_tokens([4, 4, 2, 2, 1], 8, padded=True) == [[0, 1], [2, 3, 4]]
    # [6, 3, 3, 3, 2], budget 12: greedy [6, 3] (12) [3, 3, 2] (9); cap 9 gives [6] [3, 3, 3] (9) [2]: 3 runs, and
    # caps 10, 11 the same (2 x 6 = 12 > cap), so 12 it is
    assert partition_by_tokens([6, 3, 3, 3, 2], 12, padded=True) == [[0, 1], [2, 3, 4]]
    # [5, 5, 4, 4], budget 20: one run (4 x 5 = 20); k = 1 and the cap cannot go below 20
    assert partition_by_tokens([5, 5, 4, 4], 20, padded=True) == [[0, 1, 2, 3]]
    # the same lengths packed: k = ceil(13 / 8) = 2, LPT: 4 | 4; 2 -> bin0 (6); 2 -> bin1 (6); 1 -> bin0 (7)
    assert partition_by_tokens([4, 4, 2, 2, 1], 8, padded=False) == [[0, 2, 4], [1, 3]]


def test_oversized_sample_trains_alone():
    # 10 > budget 6 gets its own micro-batch; 3 + 3 = 6 fits one (k = ceil(6 / 6) = 1)
    assert partition_by_tokens([3, 10, 3], 6, padded=False) == [[0, 2], [1]]
    assert partition_by_tokens([3, 10, 3], 6, padded=True) == [[0, 2], [1]]  # 2 rows x 3
    assert partition_by_tokens([7, 9], 6, padded=True) == [[0], [1]]


def test_micro_batch_indices_map_back_to_rows():
    lengths = torch.tensor([9, 4, 4, 2, 2, 1, 7])  # the batch's rows
    idx = torch.tensor([1, 2, 3, 4, 5])  # this rank's rows: lengths 4, 4, 2, 2, 1 (test_padded_cost_hand)
    got = micro_batch_indices(idx, lengths, micro_batch_size=2, max_tokens=8, padded=True)
    assert [g.tolist() for g in got] == [[1, 2], [3, 4, 5]]
    fixed = micro_batch_indices(idx, lengths, micro_batch_size=2, max_tokens=None, padded=True)
    assert [g.tolist() for g in fixed] == [[1, 2], [3, 4], [5]]
    assert [g.tolist() for g in micro_batch_indices(idx, lengths, None, None, True)] == [[1, 2, 3, 4, 5]]
    assert micro_batch_indices(idx[:0], lengths, 2, 8, True) == []


@pytest.mark.parametrize("padded", [False, True])
def test_random_partitions_hold_the_contract(padded):
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 40)
        budget = rng.randint(8, 120)
        lengths = [max(1, int(rng.lognormvariate(2.5, 0.9))) for _ in range(n)]  # a long tail, some beyond the budget
        groups = partition_by_tokens(lengths, budget, padded)
        assert sorted(i for g in groups for i in g) == list(range(n))  # every sample exactly once
        assert groups == partition_by_tokens(list(lengths), budget, padded)  # deterministic
        assert all(g == sorted(g) for g in groups) and [g[0] for g in groups] == sorted(g[0] for g in groups)
        costs = []
        for g in groups:
            cost = micro_batch_cost([lengths[i] for i in g], padded)
            if cost > budget:
                assert len(g) == 1, (lengths, budget, g)  # only a sample longer than the budget exceeds it
            else:
                costs.append(cost)
        fit = [x for x in lengths if x <= budget]
        if costs:
            assert -(-sum(fit) // budget) <= len(costs) <= len(fit)
            if not padded:
                assert max(costs) - min(costs) <= max(fit), (lengths, budget, groups)  # the LPT balance bound


def set_partitions(items: list[int]):
    if not items:
        yield []
        return
    for p in set_partitions(items[1:]):
        yield [[items[0]], *p]
        for i in range(len(p)):
            yield [*p[:i], [items[0], *p[i]], *p[i + 1 :]]


def test_padded_partition_is_optimal_on_small_cases():
    """Brute force over every set partition (n <= 6): the fewest micro-batches within the budget, and among those
    the lowest cost of the costliest one."""
    rng = random.Random(1)
    for _ in range(150):
        n, budget = rng.randint(1, 6), rng.randint(5, 40)
        lengths = [rng.randint(1, budget) for _ in range(n)]
        best = min((len(p), max(micro_batch_cost([lengths[i] for i in g], True) for g in p))
                   for p in set_partitions(list(range(n)))
                   if all(micro_batch_cost([lengths[i] for i in g], True) <= budget for g in p))
        got = partition_by_tokens(lengths, budget, padded=True)
        assert (len(got), max(micro_batch_cost([lengths[i] for i in g], True) for g in got)) == best, (lengths, budget)


def test_bad_budget_is_refused():
    with pytest.raises(ValueError, match="max_tokens=0"):
        partition_by_tokens([1, 2], 0, padded=False)


# -- split invariance: torch backend, float64 ---------------------------------------------------
def torch_backend(algo: AlgorithmConfig, steps: int = 1, **train_kw) -> TorchTrainBackend:
    train = TrainConfig(global_batch_size=8 // steps, num_steps_per_rollout=steps, lr=1e-3, clip_grad=0.0,
                        prefix_sharing=False, skip_zero_advantage_samples=not (algo.use_kl_loss or algo.entropy_coef),
                        **train_kw)
    b = trainers.torch_backend(base_model(), algo, train, temperature=1.0, total_steps=10, device=CPU, max_response_len=MAX_LEN)
    b.freeze_reference()
    return b


def test_the_budget_splits_the_test_batch_unevenly():
    # the invariance below means something only if the budget gives micro-batches of different sizes. Rows of
    # 9, 9, 7, 6, 7, 6, 6, 6 tokens (the last two, one agreeing group, are skipped where zero advantages are);
    # budget 16 padded: [9] [9] [7, 7] [6, 6] [6, 6] (kept rows: [9] [9] [7, 7] [6, 6])
    lengths = make_batch().attention_mask.sum(-1).tolist()
    assert lengths == [9, 9, 7, 6, 7, 6, 6, 6]
    assert partition_by_tokens(lengths, 16, padded=True) == [[0], [1], [2, 4], [3, 5], [6, 7]]
    assert partition_by_tokens(lengths[:6], 16, padded=True) == [[0], [1], [2, 4], [3, 5]]


INVARIANCE = {
    "token_mean": dict(loss_aggregation="token_mean"),
    "seq_mean_token_sum": dict(loss_aggregation="seq_mean_token_sum"),
    "seq_mean_token_sum_norm": dict(loss_aggregation="seq_mean_token_sum_norm", grpo_std_normalization=False),
    "sample_token_mean-kl_loss-entropy": dict(use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01),
}


@pytest.mark.parametrize("case", list(INVARIANCE))
@pytest.mark.parametrize("steps", [1, 2])
def test_torch_dynamic_batches_give_the_fixed_step(case, steps):
    """One micro-batch per step (micro_batch_size = the step), micro-batches of 1, and token budgets of 16 (train)
    and 30 (log-prob pass of the second step's old log-probs): the same loss, grad norm and updated weights."""
    algo = AlgorithmConfig(**INVARIANCE[case])
    batch = make_batch(grpo_std_normalization=algo.grpo_std_normalization)
    whole = torch_backend(algo, steps, micro_batch_size=8 // steps)
    ones = torch_backend(algo, steps, micro_batch_size=1)
    dyn = torch_backend(algo, steps, micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=16,
                        log_probs_max_tokens_per_gpu=30)
    calls = []
    split = dyn._micro_batches
    dyn._micro_batches = lambda *a, **k: calls.append(split(*a, **k)) or calls[-1]
    m_whole, m_ones, m_dyn = (b.train_rollout(batch) for b in (whole, ones, dyn))
    assert any(len({len(g) for g in c}) > 1 for c in calls)  # the budget made uneven micro-batches
    for key in ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy", "train/pg_clipfrac", "train/ppo_kl"):
        for m in (m_whole, m_ones):
            assert abs(m[key] - m_dyn[key]) <= 1e-9 * max(1.0, abs(m[key])), (case, key, m[key], m_dyn[key])
    for p_whole, p_ones, p_dyn in zip(whole.params, ones.params, dyn.params):
        assert_close(p_dyn, p_whole, rtol=1e-9, atol=1e-12)
        assert_close(p_dyn, p_ones, rtol=1e-9, atol=1e-12)
    # the forward-only pass places every row back where it was (on real tokens: past a row's end, a row in a wider
    # micro-batch has log-probs of its padding, one alone has zeros)
    real = batch.attention_mask[:, 1:].bool()
    assert_close(dyn.compute_log_probs(batch)[real], whole.compute_log_probs(batch)[real], rtol=1e-9, atol=1e-12)


def test_torch_critic_dynamic_batches_give_the_fixed_step():
    algo = AlgorithmConfig(advantage_estimator="ppo", normalize_advantages=True)
    fixed = torch_backend(algo, micro_batch_size=8, critic_lr=1e-2)
    dyn = torch_backend(algo, micro_batch_size=1, critic_lr=1e-2, use_dynamic_batch_size=True, max_tokens_per_gpu=24)
    for _ in range(2):  # the second rollout's values and advantages come from trained critics
        m_fixed = fixed.train_rollout(trainers.algo_advantages(samples(), algo, 2, TOK.pad_token_id, fixed))
        m_dyn = dyn.train_rollout(trainers.algo_advantages(samples(), algo, 2, TOK.pad_token_id, dyn))
        for key in ("train/value_loss", "train/value_grad_norm", "train/values_mean", "train/pg_loss"):
            assert abs(m_fixed[key] - m_dyn[key]) <= 1e-9 * max(1.0, abs(m_fixed[key])), (key, m_fixed[key], m_dyn[key])
    for p, q in zip(fixed.critic.model.parameters(), dyn.critic.model.parameters()):
        assert_close(q, p, rtol=1e-9, atol=1e-12)


# -- split invariance: megatron backend on the CPU shim -------------------------------------------
def test_megatron_dynamic_batches_give_the_fixed_step():
    """TP=PP=DP=1, float32: fixed micro-batches of 1 vs a train budget of 28 (each step's 2 rows of 14 tokens in one
    micro-batch) and a log-prob budget of 56 (the 4 rows, 14 + 14 + 14 + 11 tokens padded to 4 x 14, in one; the
    second step's old log-probs: its 2 rows in one). Two steps per rollout, so the log-prob pass feeds the loss."""
    from tests.support.megatron_cpu import shim, workers

    shim.install()

    cfg, _, hf = workers.tiny_setup()
    batch = workers.fixed_batch()
    assert batch.attention_mask.sum(-1).tolist() == [14, 14, 14, 11]
    results = []
    for train in (cfg.train, dataclasses.replace(cfg.train, use_dynamic_batch_size=True, max_tokens_per_gpu=28,
                                                 log_probs_max_tokens_per_gpu=56)):
        b = trainers.megatron_backend(hf.state_dict(), hf.config, cfg.model, cfg.parallelism, cfg.algorithm, train, 1.0, 10,
                                      CPU, max_response_len=8, seed=cfg.seed)
        if train.use_dynamic_batch_size:
            assert [mb.idx.tolist() for mb in b.runner.micro_batches(batch, torch.arange(4))] == [[0, 1], [2, 3]]
            assert [mb.idx.tolist() for mb in b.runner.micro_batches(batch, torch.arange(4), forward_only=True)] == [[0, 1, 2, 3]]
        metrics = b.train_rollout(batch)
        results.append((metrics, b.compute_log_probs(batch)))
    (m_fixed, lp_fixed), (m_dyn, lp_dyn) = results
    for key in ("train/loss", "train/pg_loss", "train/grad_norm", "train/ppo_kl", "train/pg_clipfrac"):
        assert abs(m_fixed[key] - m_dyn[key]) <= 1e-5 * max(1.0, abs(m_fixed[key])), (key, m_fixed[key], m_dyn[key])
    assert m_fixed["train/grad_norm"] > 0 and m_fixed["train/ppo_kl"] != 0  # it trained; step 2's old log-probs count
    real = batch.attention_mask[:, 1:].bool()
    assert_close(lp_dyn[real], lp_fixed[real], rtol=0, atol=1e-5)


def train_once(parallel: dict, train_overrides: dict) -> dict:
    """One train_rollout (one step of the 4 rows) of the tiny megatron backend; metrics and log-probs after it."""
    from tests.support.megatron_cpu import workers

    cfg, _, hf = workers.tiny_setup(["train.num_steps_per_rollout=1"])
    b = trainers.megatron_backend(hf.state_dict(), hf.config, cfg.model, dataclasses.replace(cfg.parallelism, **parallel),
                                  cfg.algorithm, dataclasses.replace(cfg.train, **train_overrides), 1.0, 10, CPU,
                                  max_response_len=8, seed=cfg.seed)
    batch = workers.uneven_batch()
    mine = torch.arange(4)[torch.distributed.get_rank() :: torch.distributed.get_world_size()]
    return {"micro_batches": [mb.idx.tolist() for mb in b.runner.micro_batches(batch, mine)],
            "metrics": b.train_rollout(batch), "after": b.compute_log_probs(batch)}


def dp2_main(rank: int, port: int, out_dir: str) -> None:
    import os

    from tests.support.megatron_cpu import shim

    shim.install()
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    res = train_once({}, dict(use_dynamic_batch_size=True, max_tokens_per_gpu=25))
    torch.save(res, os.path.join(out_dir, f"dp2_rank{rank}.pt"))


@pytest.mark.integration
def test_megatron_dp2_ranks_with_different_micro_batch_counts_give_the_single_step(tmp_path):
    """DP=2 (gloo, 2 processes): rank 0 holds rows 0, 2 (14 + 14 tokens, 2 x 14 = 28 > 25: two micro-batches), rank 1
    rows 1, 3 (10, 11: 2 x 11 = 22: one). Gradients are summed over DP once, after each rank's schedule, so the step
    equals one process with fixed micro-batches of 1."""
    import socket

    from tests.support.megatron_cpu import shim, workers

    shim.install()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    warm_spawn.spawn(dp2_main, args=(port, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"dp2_rank{r}.pt") for r in (0, 1)]
    assert ranks[0]["micro_batches"] == [[0], [2]] and ranks[1]["micro_batches"] == [[1, 3]]
    single = train_once({}, {})
    real = workers.uneven_batch().attention_mask[:, 1:].bool()
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert ranks[0]["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-4, abs=1e-6), key
    for r in ranks:
        assert_close(r["after"][real], single["after"][real], rtol=0, atol=1e-4)


# -- validation -----------------------------------------------------------------------------------
def problems_of(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        preflight(overrides)
    return info.value.problems


def test_validation_names_the_keys_and_fixes():
    (msg,) = problems_of(["train.use_dynamic_batch_size=true"])
    assert "train.use_dynamic_batch_size=true needs train.max_tokens_per_gpu" in msg and "train.max_tokens_per_gpu=4096" in msg
    probs = problems_of(["train.use_dynamic_batch_size=true", "train.max_tokens_per_gpu=0",
                         "train.log_probs_max_tokens_per_gpu=-5"])
    assert any("train.max_tokens_per_gpu=0 must be >= 1" in p for p in probs)
    assert any("train.log_probs_max_tokens_per_gpu=-5 must be >= 1" in p for p in probs)
    probs = problems_of(["train=megatron", "parallelism.pipeline_model_parallel_size=2", "train.use_dynamic_batch_size=true",
                         "train.max_tokens_per_gpu=256"])
    assert any("parallelism.pipeline_model_parallel_size=2" in p and "set parallelism.pipeline_model_parallel_size=1 or "
               "train.use_dynamic_batch_size=false" in p for p in probs), probs
    cfg = compose_run(["train.use_dynamic_batch_size=true", "train.max_tokens_per_gpu=256"])
    assert cfg.train.max_tokens_per_gpu == 256 and cfg.train.log_probs_max_tokens_per_gpu is None


def test_cli_exits_2_on_a_missing_budget(workdir):
    proc = run_cli(["train.use_dynamic_batch_size=true", "num_rollout=1"], workdir, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "train.use_dynamic_batch_size=true needs train.max_tokens_per_gpu" in proc.stderr
