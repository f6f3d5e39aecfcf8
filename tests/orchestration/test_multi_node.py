"""Megatron ranks and SGLang engines over two nodes: Ray's own multi-node test cluster (`ray.cluster_utils.Cluster`).

One cluster for the module: a head node with no CPUs (the driver's, where nothing is placed) and two worker nodes of
2 CPUs, each with its own raylet; a CPU bundle stands for a GPU. Every server binds the loopback (each node's IP is
127.0.0.1, as orchestration/local_cluster.py binds a run's own cluster) and the cluster runs with the session's token
(tests/conftest.py). The tiny model, CPU engines, 2 rollouts each, every sync checked equal
(`rollout.check_weight_update_equal=true`):
- disaggregated, PP=2: the two megatron ranks (one per stage) on one node, the engine on the other; each stage's rank
  opens its own gloo update group with the engine and broadcasts its own layers; the driver fetches no tensor.
- colocated, TP=2: a rank and an engine on each node, each engine fed handles by the rank on its own node.
In both, `slime-hydra plan` of the layout (on nodes of as many bundles as the test's nodes offer) is the placement the
run observes: each rank's node and bundle, each engine's bundles and node (nodes numbered by their first bundle).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import pytest

from slime_hydra.app.preflight import compose_run
from tests.support.megatron_cpu import shim
from tests.support.megatron_cpu.ray_ranks import SHIM_HOOK
from tests.support.plans import engines, ranks

pytestmark = [pytest.mark.sglang, pytest.mark.integration]

EXPERIMENT = "experiment=grpo/qwen3-tiny-addition-cpu-sglang-torch-v1"
COMMON = [EXPERIMENT, "train=megatron", "logger=none", "logger.progress_bar=false", "train.lr_decay_style=constant",
          "cluster.backend=ray", "cluster.device=cpu", "cluster.actor_num_gpus_per_node=2",
          "rollout.check_weight_update_equal=true", "rollout.sglang.max_total_tokens=16384", "cluster.ray_call_timeout_s=1800",
          "warmstart.steps=0", "num_rollout=2", "eval.eval_interval=null", "rollout.rollout_batch_size=8",
          "train.micro_batch_size=16"]
NODE_CPUS = 2


@pytest.fixture(scope="module")
def two_nodes(ray_python):
    """The module's cluster: a head without CPUs and two nodes of NODE_CPUS, loopback and token auth; this process
    joins it as a job whose workers install the megatron CPU shim."""
    import ray
    from ray.cluster_utils import Cluster

    from slime_hydra.orchestration.local_cluster import is_loopback, loopback_node, run_temp_dir

    assert os.environ.get("RAY_AUTH_MODE") == "token" and os.environ.get("RAY_AUTH_TOKEN")  # tests/conftest.py
    if ray.is_initialized():
        ray.shutdown()
    shim.install()
    common = {"node_ip_address": "127.0.0.1", "temp_dir": run_temp_dir(), "object_store_memory": 200 * 1024 * 1024}
    # Cluster writes the head's address to $RAY_TMPDIR/ray/ray_current_cluster (/tmp/ray without it), a directory a
    # fresh machine does not have and one that every Ray user on the node reads: the module's own, beside its cluster
    address_dir = Path(common["temp_dir"]).parent
    (address_dir / "ray").mkdir()
    with pytest.MonkeyPatch.context() as env, loopback_node():
        env.setenv("RAY_TMPDIR", str(address_dir))
        env.setattr(sys, "executable", ray_python)  # the nodes' workers fork from a warm interpreter (conftest)
        cluster = Cluster(initialize_head=True, head_node_args={**common, "num_cpus": 0, "include_dashboard": False})
        workers = [cluster.add_node(**common, num_cpus=NODE_CPUS) for _ in range(2)]
        root = str(Path(__file__).resolve().parents[2])
        ray.init(address=cluster.address, namespace="multi_node", logging_level="WARNING",
                 runtime_env={"worker_process_setup_hook": SHIM_HOOK, "env_vars": {"PYTHONPATH": root}})
    try:
        assert is_loopback(ray.get_runtime_context().gcs_address)
        alive = [n for n in ray.nodes() if n["Alive"]]
        assert len(alive) == 3 and {n["NodeManagerAddress"] for n in alive} == {"127.0.0.1"}
        assert sorted(n["Resources"].get("CPU", 0.0) for n in alive) == [0.0, NODE_CPUS, NODE_CPUS]
        yield [w.node_id for w in workers]
    finally:
        ray.shutdown()
        cluster.shutdown()


@contextlib.contextmanager
def cpus_held(node_ids: list[str], n: int):
    """`n` CPUs of each node held by an idle actor pinned there, so that a placement group finds NODE_CPUS - n free
    on each node (PACK then spreads its bundles over both)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote
    class Hold:
        def ready(self) -> bool:
            return True

    held = [Hold.options(num_cpus=n, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
            for node in node_ids]
    ray.get([h.ready.remote() for h in held], timeout=300)
    try:
        yield
    finally:
        for h in held:
            ray.kill(h)


def node_of_actor(actor) -> str:
    import ray

    return ray.get(actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()), timeout=120)


def observed(c) -> tuple[dict[int, dict[str, int]], dict[int, tuple[list[int], int]]]:
    """What Ray placed, as the plan prints it: rank -> {node, bundle}, engine -> (bundles, node); a node's number is
    its rank by the lowest bundle it holds."""
    from slime_hydra.orchestration.placement import bundle_nodes

    launcher = c.rollout.group.launcher
    layout, by_bundle = launcher.layout, bundle_nodes(launcher.pg)
    number = {node: i for i, node in enumerate(dict.fromkeys(by_bundle[b] for b in sorted(by_bundle)))}
    rank_nodes = [node_of_actor(r) for r in c.trainer.ranks]
    assert rank_nodes == [by_bundle[b] for b in layout.actor_bundles]  # each rank runs on its bundle's node
    engine_nodes = [launcher.nodes[e][0] for e in range(len(layout.engine_bundles))]
    assert engine_nodes == [by_bundle[bs[0]] for bs in layout.engine_bundles]  # each engine's actor on its own bundle
    return ({r: {"node": number[n], "bundle": b} for r, (n, b) in enumerate(zip(rank_nodes, layout.actor_bundles))},
            {e: (list(bs), number[engine_nodes[e]]) for e, bs in enumerate(layout.engine_bundles)})


def planned(args: list[str], per_node: int) -> tuple[dict[int, dict[str, int]], dict[int, tuple[list[int], int]]]:
    from slime_hydra.app import plan

    text = plan.plan_text(args, gpus_per_node=per_node)
    return {r: {"node": v["node"], "bundle": v["bundle"]} for r, v in ranks(text).items()}, engines(text)


@contextlib.contextmanager
def fetched_tensors(trainer):
    """The tensors the driver fetches from the object store (rank 0's gathered weights), counted as they are read."""
    from slime_hydra.orchestration.rank_weights import WeightsRef

    count = [0]

    class Counted(WeightsRef):
        def __iter__(self):
            for kv in super().__iter__():
                count[0] += 1
                yield kv

    fetch = trainer._in_object_store
    trainer._in_object_store = lambda: Counted(fetch().ref, trainer.calls)
    try:
        yield count
    finally:
        trainer._in_object_store = fetch


def built(args: list[str], out: Path, label: str):
    from slime_hydra.app.build import build

    cfg = compose_run(args)
    t0 = time.monotonic()
    c = build(cfg, str(out))
    print(f"{label}: build {time.monotonic() - t0:.0f} s")
    return cfg, c


def two_rollouts(cfg, c, out: Path, label: str) -> list:
    from slime_hydra.app.session import loop_settings
    from slime_hydra.engine import loop

    t0 = time.monotonic()
    history = loop.run(loop_settings(cfg), c, str(out / "ckpt"))
    print(f"{label}: 2 rollouts {time.monotonic() - t0:.0f} s")
    return history


def versions_of(history) -> list[float]:
    return [m["rollout/weight_version"] for _, m in history if "rollout/weight_version" in m]


def staged_names(rank) -> list[str]:
    import ray

    return ray.get(rank.__ray_call__.remote(lambda self: [name for name, _ in self._staged]), timeout=120)


def update_groups(rank) -> dict[int, str]:
    import ray

    names = lambda self: {e: g.pg_name for e, g in (self._update_groups.groups if self._update_groups else {}).items()}  # noqa: E731
    return ray.get(rank.__ray_call__.remote(names), timeout=120)


def test_disaggregated_pipeline_stages_each_send_their_own_layers(two_nodes, tmp_path):
    """PP=2 (rank 0 stage 0, rank 1 stage 1) on one node, one engine on the other: each stage's rank opens its own update
    group with the engine and broadcasts its own layers (rank 0 the embeddings and layers 0-1, rank 1 layers 2-3 and the
    final norm; the embeddings are tied), every sync checked equal against each stage's tensors, no tensor through the
    driver; the plan on nodes of 2 is the placement."""
    from slime_hydra.orchestration.rank_weights import RankWeights

    args = [*COMMON, "parallelism.pipeline_model_parallel_size=2", "parallelism.tensor_model_parallel_size=1",
            "cluster.rollout_num_gpus=1", "cluster.colocate=false"]
    cfg, c = built(args, tmp_path, "disaggregated PP=2")
    try:
        with fetched_tensors(c.trainer) as fetched:
            history = two_rollouts(cfg, c, tmp_path, "disaggregated PP=2")
        r = c.rollout
        assert r.mode == "distributed" and r._groups == {} and fetched == [0]
        assert versions_of(history) == [0.0, 1.0] and r.weight_version == 2 == r.synced_version
        assert c.trainer.stages == [0, 1]
        assert isinstance(r._last_weights, RankWeights) and r._last_weights.feeders == [[0], [1]]
        for rank in c.trainer.ranks:  # one group each with engine 0, opened by that rank
            assert list(update_groups(rank)) == [0]
        first, second = staged_names(c.trainer.ranks[0]), staged_names(c.trainer.ranks[1])
        layers = lambda names: sorted({int(n.split(".")[2]) for n in names if n.startswith("model.layers.")})  # noqa: E731
        assert layers(first) == [0, 1] and layers(second) == [2, 3], (first, second)
        assert "model.embed_tokens.weight" in first and "model.norm.weight" in second and not set(first) & set(second)
        rank_at, engine_at = observed(c)
        assert {e: n for e, (_, n) in engine_at.items()} == {0: 1} and {v["node"] for v in rank_at.values()} == {0}
        assert (rank_at, engine_at) == planned(args, NODE_CPUS)
    finally:
        c.rollout.shutdown()


def test_colocated_engine_on_each_node_gets_its_nodes_rank(two_nodes, tmp_path):
    """TP=2 colocated over both nodes (one CPU of each held, so each node takes one bundle): rank r and engine r share
    bundle r on node r; each engine gets handles from the rank on its own node; every sync equal; the plan on nodes of 1
    is the placement. Before the loop, the colocated ranks' log-probs and first step are the single process's, as
    test_megatron_sglang.py checks them (its one-node colocated case runs in the slow tier: this one covers it)."""
    from slime_hydra.orchestration.rank_weights import RankWeights
    from tests.orchestration.test_megatron_sglang import assert_engines_hold_rank0s_weights, assert_first_step_equal, first_step

    args = [*COMMON, "parallelism.tensor_model_parallel_size=2", "cluster.rollout_num_gpus=2", "cluster.colocate=true"]
    with cpus_held(two_nodes, NODE_CPUS - 1):
        cfg, c = built(args, tmp_path, "colocated over two nodes")
    try:
        step = first_step(args, cfg, c)
        print(f"colocated over two nodes: first step {step}")
        history = two_rollouts(cfg, c, tmp_path, "colocated over two nodes")
        r = c.rollout
        assert step["tokens"] > 0 and step["ray_vs_local"] < 1e-4 and step["ray_vs_engine"] < 1e-2, step
        assert_first_step_equal(step)
        assert r.mode == "tensor" and versions_of(history) == [0.0, 1.0] and r.weight_version == 2 == r.synced_version
        assert isinstance(r._last_weights, RankWeights) and r._last_weights.engine_ranks == [[[0], [1]]]
        rank_at, engine_at = observed(c)
        assert {v["node"] for v in rank_at.values()} == {0, 1}
        assert all(engine_at[e][1] == rank_at[e]["node"] for e in engine_at)  # engine e's sender is on its node
        assert (rank_at, engine_at) == planned(args, 1)
        assert {host for _, host in r.group.launcher.nodes.values()} <= {"127.0.0.1"}
        assert_engines_hold_rank0s_weights(cfg, c)
    finally:
        c.rollout.shutdown()


@pytest.mark.slow
def test_colocated_pipeline_stages_on_one_node_send_handles_per_stage(two_nodes, tmp_path):
    """PP=2 colocated on one node (2 bundles; PACK keeps them together): engine e shares rank e's bundle and gets stage
    0's handles from rank 0 and stage 1's from rank 1, both on its node, in one weight-update session; every sync equal,
    no tensor through the driver."""
    from slime_hydra.orchestration.rank_weights import RankWeights

    args = [*COMMON, "parallelism.pipeline_model_parallel_size=2", "parallelism.tensor_model_parallel_size=1",
            "cluster.rollout_num_gpus=2", "cluster.colocate=true"]
    cfg, c = built(args, tmp_path, "colocated PP=2")
    try:
        with fetched_tensors(c.trainer) as fetched:
            history = two_rollouts(cfg, c, tmp_path, "colocated PP=2")
        r = c.rollout
        assert r.mode == "tensor" and fetched == [0] and versions_of(history) == [0.0, 1.0] and r.synced_version == 2
        assert isinstance(r._last_weights, RankWeights) and r._last_weights.engine_ranks == [[[0], [0]], [[1], [1]]]
        rank_at, engine_at = observed(c)
        assert {v["node"] for v in rank_at.values()} == {0} and (rank_at, engine_at) == planned(args, NODE_CPUS)
    finally:
        c.rollout.shutdown()
