"""`slime-hydra plan`: the placement plan of every shipped experiment, checked against layouts derived by hand.

Megatron's rank order is tp-cp-ep-dp-pp (TP varies fastest, PP slowest), so with CP = EP = 1 a rank is
r = tp + TP·dp + TP·DP·pp: a TP group is TP consecutive ranks, a DP group strides by TP inside one pipeline
stage, a PP group strides by TP·DP. Bundles are one per GPU, rank r on bundle r; colocated engines take
bundles 0.. of the same group, disaggregated ones the bundles after the train ranks; nodes are filled in
bundle order (8 GPUs a node unless --gpus-per-node says otherwise).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

import pytest

from slime_hydra.app import plan
from slime_hydra.app.preflight import compose_run
from slime_hydra.errors import ConfigError
from tests.support.plans import engines, ranks
from tests.support.runs import EXPERIMENTS, ROOT, run_cli

QWEN3_4B = "grpo/qwen3-4b-dapo-math-1n8g-megatron-sglang-colocate-v1"
GLM4_9B = "grpo/glm4-9b-dapo-math-1n8g-megatron-sglang-colocate-v1"
AGENT = "agent/qwen3-4b-calculator-multiturn-1n8g-megatron-sglang-colocate-v1"
ASYNC = "async/qwen3-4b-dapo-math-1n8g-megatron-sglang-async-v1"
QWEN3_30B = "grpo/qwen3-30b-a3b-dapo-math-2n8g-megatron-sglang-colocate-v1"


def groups(text: str, kind: str) -> list[list[int]]:
    line = next(line for line in text.splitlines() if line.startswith(f"  {kind} groups: "))
    return sorted(sorted(int(x) for x in g.split(",")) for g in re.findall(r"\[([\d, ]+)\]", line))


def section(text: str, head: str) -> list[str]:
    """The indented lines under the line starting with `head` ([] when there is none)."""
    lines, out = text.splitlines(), []
    start = next((i for i, line in enumerate(lines) if line.startswith(head)), len(lines))
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        out.append(line)
    return out


def tp2_on(world: int, pp: int = 1) -> dict[str, list[list[int]]]:
    """TP=2 groups on `world` ranks, by the formula in the module docstring (r = tp + 2·dp + 2·DP·pp)."""
    dp = world // (2 * pp)
    at = lambda t, d, p: t + 2 * d + 2 * dp * p  # noqa: E731
    return {"TP": sorted([at(0, d, p), at(1, d, p)] for d in range(dp) for p in range(pp)),
            "DP": sorted([at(t, d, p) for d in range(dp)] for t in range(2) for p in range(pp)),
            "PP": sorted([at(t, d, p) for p in range(pp)] for t in range(2) for d in range(dp))}


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_has_a_plan(name, capsys):
    assert plan.main([f"experiment={name}"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"plan of experiment={name} (nothing started")
    for head in ("cluster: ", "train: ", "rollout: ", "memory:", "weight sync: "):
        assert any(line.startswith(head) for line in out.splitlines()), (head, out)


@pytest.mark.parametrize("name,engine_gpus", [(QWEN3_4B, 2), (GLM4_9B, 2), (AGENT, 1)])
def test_colocated_1n8g_plans(name, engine_gpus):
    """1 node × 8 GPUs, TP=2 (so DP=4), colocated: rank r on bundle and GPU r of node 0, sharing it with the engine
    whose bundles hold r; 8 / rollout_num_gpus_per_engine engines on bundles [k·e, k·e + k)."""
    text = plan.plan_text([f"experiment={name}"])
    table = ranks(text)
    assert Counter(r["node"] for r in table.values()) == {0: 8}
    assert all(r["bundle"] == r["GPU"] == rank and (r["TP"], r["DP"], r["PP"]) == (rank % 2, rank // 2, 0)
               for rank, r in table.items())
    want = tp2_on(8)
    assert {k: groups(text, k) for k in want} == want
    assert want["TP"] == [[0, 1], [2, 3], [4, 5], [6, 7]] and want["DP"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    k = engine_gpus
    assert engines(text) == {e: (list(range(k * e, k * e + k)), 0) for e in range(8 // k)}
    assert "one placement group of 8 bundle(s)" in text and "on half of its bundle" in text
    assert "rollout.sglang.mem_fraction_static: 0.7" in text and "cluster.offload_rollout: true: the engines release" in text
    assert "rollout.weight_sync=auto -> tensor (cluster.colocate=true)" in text
    assert any(line.startswith("  model.hf_checkpoint: /root/") for line in section(text, "missing"))


def test_disaggregated_async_plan():
    """actor 1 × 4 (TP=2, DP=2) on bundles 0-3, 4 engines of 1 GPU on bundles 4-7 of the same 8-GPU node."""
    text = plan.plan_text([f"experiment={ASYNC}"])
    table = ranks(text)
    assert Counter(r["node"] for r in table.values()) == {0: 4} and [r["bundle"] for r in table.values()] == [0, 1, 2, 3]
    want = tp2_on(4)
    assert {k: groups(text, k) for k in want} == want == {"TP": [[0, 1], [2, 3]], "DP": [[0, 2], [1, 3]],
                                                          "PP": [[0], [1], [2], [3]]}
    assert engines(text) == {0: ([4], 0), 1: ([5], 0), 2: ([6], 0), 3: ([7], 0)}
    assert "on all of its bundle" in text and "rollout.weight_sync=auto -> distributed (cluster.colocate=false)" in text
    # the train ranks open the engines' NCCL update groups (engine e fed by rank e % 4): runnable, nothing via the driver
    sync = section(text, "weight sync: ")
    assert sync[0].startswith("  from each train rank's own TP-gathered Hugging Face tensors"), sync
    assert sync[1].startswith("  by the train ranks: ") and "(NCCL from the rank's GPU)" in sync[1], sync
    assert "(engine 0: rank 0; engine 1: rank 1; engine 2: rank 2; engine 3: rank 3)" in sync[1], sync
    assert section(text, "not runnable yet") == []
    # with pipeline stages (ranks 0, 1 stage 0; 2, 3 stage 1) each stage's rank opens its own group with the engine
    staged = plan.plan_text([f"experiment={ASYNC}", "parallelism.pipeline_model_parallel_size=2", "train.qkv_format=bshd",
                             "train.use_dynamic_batch_size=false"])  # the recipe's packing runs with TP/DP only
    sync = section(staged, "weight sync: ")
    assert sync[1].startswith("  by the train ranks: ") and "one update group per engine and stage" in sync[1], sync
    assert ("(engine 0: stage 0 rank 0 / stage 1 rank 2; engine 1: stage 0 rank 1 / stage 1 rank 3; "
            "engine 2: stage 0 rank 0 / stage 1 rank 2; engine 3: stage 0 rank 1 / stage 1 rank 3)") in sync[1], sync
    assert "the driver its rank 0" not in staged and section(staged, "not runnable yet") == []


def test_expert_parallel_groups_of_the_30b_a3b_plan():
    """TP=4 × EP=8 with whole experts (ETP=1) on 2 nodes × 8: the dense grid is r = tp + 4·dp (DP=4); the experts' grid
    is r = ep + 8·edp (expert TP 1, EP varies fastest), so each node's 8 consecutive ranks form one EP group (16 of the
    128 experts each) and expert DP is 2 (rank r and r + 8 hold the same experts)."""
    text = plan.plan_text([f"experiment={QWEN3_30B}"])
    table = ranks(text)
    assert Counter(r["node"] for r in table.values()) == {0: 8, 1: 8}
    assert all((r["TP"], r["DP"], r["EP"], r["node"]) == (rank % 4, rank // 4, rank % 8, rank // 8) for rank, r in table.items())
    assert groups(text, "EP") == [list(range(8)), list(range(8, 16))]
    assert groups(text, "TP") == [[4 * d + t for t in range(4)] for d in range(4)]
    assert groups(text, "DP") == [[t + 4 * d for d in range(4)] for t in range(4)]
    assert "experts: ETP=1 EP=8 -> expert DP=2" in text
    assert engines(text) == {0: (list(range(8)), 0), 1: (list(range(8, 16)), 1)}


def test_update_group_to_colocated_gpu_engines_is_not_runnable():
    """A rank and its engine share a GPU, and NCCL refuses two ranks of a group on one device: refused, keys named."""
    text = plan.plan_text([f"experiment={QWEN3_4B}", "rollout.weight_sync=distributed"])
    (refusal,) = section(text, "not runnable yet")
    assert "rollout.weight_sync=distributed with cluster.colocate=true on cluster.device=auto" in refusal
    assert "set rollout.weight_sync=auto (tensor when colocated), or cluster.colocate=false" in refusal


def test_two_nodes_with_pipeline_stages():
    """2 nodes × 8, TP=2 PP=2 (DP=4): ranks 0-7 on node 0, 8-15 on node 1; a PP group pairs r and r + 8."""
    # the recipe's packing by a token budget runs with TP/DP only: pipeline stages take fixed, padded micro-batches
    text = plan.plan_text([f"experiment={QWEN3_4B}", "cluster.actor_num_nodes=2", "parallelism.pipeline_model_parallel_size=2",
                           "train.qkv_format=bshd", "train.use_dynamic_batch_size=false"])
    table = ranks(text)
    assert Counter(r["node"] for r in table.values()) == {0: 8, 1: 8}
    assert all((r["node"], r["GPU"]) == divmod(rank, 8) for rank, r in table.items())
    want = tp2_on(16, pp=2)
    assert {k: groups(text, k) for k in want} == want
    assert want["PP"][:2] == [[0, 8], [1, 9]] and [0, 2, 4, 6] in want["DP"] and [9, 11, 13, 15] in want["DP"]
    assert engines(text) == {e: ([2 * e, 2 * e + 1], e // 4) for e in range(8)}
    assert "one placement group of 16 bundle(s)" in text
    # engines on both nodes are driven; colocated handles are not, where a node holds one stage's ranks only
    (refusal,) = section(text, "not runnable yet")
    assert "parallelism.pipeline_model_parallel_size=2 over cluster.actor_num_nodes=2 nodes" in refusal, refusal
    assert "set cluster.colocate=false (update groups reach other nodes)" in refusal, refusal
    apart = plan.plan_text([f"experiment={QWEN3_4B}", "cluster.actor_num_nodes=2", "parallelism.pipeline_model_parallel_size=2",
                            "train.qkv_format=bshd", "train.use_dynamic_batch_size=false", "cluster.colocate=false",
                            "cluster.rollout_num_gpus=8"])
    assert section(apart, "not runnable yet") == []


def test_missing_checkpoint_is_listed_not_fatal(tmp_path):
    absent = tmp_path / "absent"
    overrides = ["experiment=grpo/qwen3-tiny-addition-cpu-local-torch-v4", f"model.hf_checkpoint={absent}"]
    text = plan.plan_text(overrides)
    assert section(text, "missing") == [f"  model.hf_checkpoint: {absent}"]
    with pytest.raises(ConfigError, match="config.json not found"):  # a run still stops at it
        compose_run(overrides)


def test_other_config_errors_stop_the_plan(workdir):
    with pytest.raises(ConfigError) as e:  # TP=2 divides 6 ranks, but TP × PP = 4 does not (nor do they split 256 samples)
        plan.plan_text([f"experiment={QWEN3_4B}", "cluster.actor_num_gpus_per_node=6", "parallelism.pipeline_model_parallel_size=2"])
    assert "= 2 × 2 × 1 = 4 must divide the train ranks (cluster.actor_num_nodes × cluster.actor_num_gpus_per_node = 1 × 6 = 6)" in str(e.value)
    with pytest.raises(ConfigError, match="cluster.actor_num_gpus_per_node=8, but the largest node .* has 4 GPU"):
        plan.plan_text([f"experiment={QWEN3_4B}"], gpus_per_node=4)
    out = run_cli(["plan", f"experiment={QWEN3_4B}", "cluster.actor_num_gpus_per_nod=8"], workdir, timeout=300)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: 1 config error:") and "cluster.actor_num_gpus_per_node" in out.stderr


@pytest.mark.integration
def test_readme_shows_the_4b_plan(workdir):
    """Through the CLI, as a user runs it, in a fresh interpreter that then says what the plan imported (neither Ray nor
    SGLang; torch without touching CUDA). The README's copy is the output of this commit."""
    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: print('imported:', 'ray' in sys.modules, 'sglang' in sys.modules,\n"
             "                              'torch' in sys.modules and sys.modules['torch'].cuda.is_initialized(), file=sys.stderr))\n"
             f"sys.argv = ['slime-hydra', 'plan', 'experiment={QWEN3_4B}']\n"
             "runpy.run_module('slime_hydra', run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", probe], cwd=workdir, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[-1] == "imported: False False False"
    readme = (ROOT / "README.md").read_text()
    shown = re.search(rf"```text\n\$ slime-hydra plan experiment={QWEN3_4B}\n(.*?)```", readme, re.S)
    assert shown is not None, "README.md lost its plan of the 4B recipe"
    assert shown.group(1) == out.stdout, "README.md's plan of the 4B recipe drifted: paste the new output"
    usage = run_cli(["plan", "--help"], workdir, timeout=300)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: slime-hydra plan")
