"""What each cluster backend can place, checked before Ray, data or models start (no ray import here).

`cluster.backend=local` runs one train rank and one engine in the driver. `cluster.backend=ray` (app/build_ray.py)
places torch train ranks or megatron train ranks (orchestration/megatron_group.py), PPO's critic inside either, and
either `local` engines behind a rollout manager actor or SGLang engines whose servers Ray actors own
(orchestration/sglang_engines.py) on every node of the placement
(tests/orchestration/test_multi_node.py); any train backend with either rollout backend (tests/orchestration/
test_megatron_sglang.py runs megatron ranks with SGLang engines). Weights reach the SGLang engines from the train ranks
(orchestration/rank_weights.py), each pipeline stage's from a rank of that stage: handles to their tensors when
colocated (from ranks on the engine's node), and over update groups the ranks open (NCCL on GPUs, gloo on CPU)
otherwise. One case is not driven yet and is refused here, with every key to change, rather than after data loading
at launch: on GPUs, an update group to colocated engines (NCCL refuses two ranks of a group on one GPU); and colocated
engines over nodes that each hold only some pipeline stages (handles open only on their own node).
The megatron layout against the ranks is checked beside that backend (training/megatron/checks.py); what the Ray
cluster holds, at orchestration start (orchestration/placement.py), before any actor is built.

The composition floor (app/checks.py) calls these with the groups they read; each problem names the key and the fix.
"""

from __future__ import annotations

from typing import Optional

from slime_hydra.config.schema import ClusterConfig, ParallelismConfig, RolloutConfig, TrainConfig
from slime_hydra.orchestration.placement import plan_layout
from slime_hydra.orchestration.senders import engine_ranks, megatron_stages
from slime_hydra.rollout.sglang.checks import weight_sync_mode
from slime_hydra.training.megatron.checks import model_parallel_size

NOT_YET = "cluster.backend=ray does not drive"  # the start of every refusal of a pairing (app/plan.py lists them apart)


def data_parallel_ranks(c: ClusterConfig, train_backend: str, p: ParallelismConfig) -> tuple[int, str]:
    """The ranks a step's batch splits over, and how they were counted: every train rank of cluster.backend=ray
    (torch: each a data-parallel rank), megatron's model-parallel ranks (TP × PP × CP) taking one share together."""
    ranks = c.actor_num_nodes * c.actor_num_gpus_per_node if c.backend == "ray" else 1
    how = f"cluster.actor_num_nodes × cluster.actor_num_gpus_per_node = {c.actor_num_nodes} × {c.actor_num_gpus_per_node} = {ranks}"
    model = model_parallel_size(p)
    if train_backend == "megatron" and model > 1 and ranks % model == 0:  # (a layout that does not divide is refused)
        how = f"{ranks} ranks / (TP × PP × CP = {model})"
        ranks //= model
    return max(ranks, 1), how


def check(c: ClusterConfig, rollout_backend: str, train: TrainConfig, p: ParallelismConfig) -> tuple[list[str], list[str]]:
    """(problems, notes): the train ranks and engines each cluster backend runs, and a step's batch over the ranks."""
    problems: list[str] = []
    notes: list[str] = []
    if c.rollout_num_gpus is None:  # config/checks.py names it
        return problems, notes
    actor = c.actor_num_nodes * c.actor_num_gpus_per_node
    actor_txt = f"cluster.actor_num_nodes × cluster.actor_num_gpus_per_node = {c.actor_num_nodes} × {c.actor_num_gpus_per_node} = {actor}"
    per = c.rollout_num_gpus_per_engine
    if c.backend == "local":
        if actor > 1:
            problems.append(f"{actor_txt} data-parallel train ranks need cluster.backend=ray (one Ray actor per rank); "
                            "set cluster.backend=ray or cluster.actor_num_gpus_per_node=1")
        if c.address is not None:
            problems.append(f"cluster.address={c.address} is only read with cluster.backend=ray; set cluster.backend=ray or drop it")
    if rollout_backend == "local":
        if per != 1:
            problems.append(f"cluster.rollout_num_gpus_per_engine={per}: a rollout.backend=local engine runs on one device; "
                            "set cluster.rollout_num_gpus_per_engine=1")
        if c.backend == "local" and c.rollout_num_gpus not in (1, actor):
            problems.append(f"cluster.rollout_num_gpus={c.rollout_num_gpus} engines need cluster.backend=ray "
                            "(cluster.backend=local runs one engine in the driver); set cluster.backend=ray")
    if c.backend != "ray":
        return problems, notes
    gbs, micro = train.global_batch_size, train.micro_batch_size
    dp, dp_txt = data_parallel_ranks(c, train.backend, p)
    if gbs and gbs % dp:
        problems.append(f"train.global_batch_size={gbs} is not divisible by the {dp} data-parallel ranks ({dp_txt}); "
                        f"set train.global_batch_size to a multiple of {dp}")
    # micro_batch_size still None here means the batch identity failed (already reported)
    elif gbs and micro and (gbs // dp) % micro:
        problems.append(f"train.micro_batch_size={micro} must divide the per-rank batch train.global_batch_size / "
                        f"data-parallel ranks = {gbs} / {dp} = {gbs // dp}; set train.micro_batch_size to a divisor of {gbs // dp}")
    notes.append(f"cluster: {actor_txt} train ranks, cluster.rollout_num_gpus={c.rollout_num_gpus} in "
                 f"{c.rollout_num_gpus // max(per, 1)} engine(s), {'colocated' if c.colocate else 'disaggregated'}")
    return problems, notes


def check_local_only(c: ClusterConfig, streaming: bool, load_debug_rollout_data: Optional[str],
                     debug_rollout_only: bool) -> list[str]:
    """What runs with cluster.backend=local only: the debug split's two modes, and streamed prompt data."""
    if c.backend != "ray":
        return []
    problems = []
    if load_debug_rollout_data or debug_rollout_only:
        problems.append(f"{'load_debug_rollout_data' if load_debug_rollout_data else 'debug_rollout_only'} runs with "
                        "cluster.backend=local; set cluster.backend=local")
    if streaming:
        problems.append("data.streaming=true does not support cluster.backend=ray: the rollout manager owns an in-memory "
                        "source there; set cluster.backend=local or data.streaming=false")
    return problems


def check_ray_sglang(c: ClusterConfig, train_backend: str, rollout: RolloutConfig, p: ParallelismConfig) -> list[str]:
    """SGLang engines under Ray: the pairings not driven yet (each refusal starts with NOT_YET)."""
    if c.backend != "ray" or rollout.backend != "sglang":
        return []
    mode = weight_sync_mode(rollout.weight_sync, c.colocate)
    pp = p.pipeline_model_parallel_size if train_backend == "megatron" else 1
    if mode == "tensor" and c.colocate and pp > 1 and c.actor_num_nodes > 1 and c.rollout_num_gpus is not None:
        # the nodes as PACK fills them: actor_num_gpus_per_node bundles each, in bundle order
        layout = plan_layout(c, use_gpu=False)
        ranks = len(layout.actor_bundles)
        node = {b: b // c.actor_num_gpus_per_node for b in range(layout.num_bundles)}
        if engine_ranks(layout.actor_bundles, layout.engine_bundles, megatron_stages(ranks, pp), node) is None:
            return [f"{NOT_YET} rollout.weight_sync=tensor (the default with cluster.colocate=true) with "
                    f"parallelism.pipeline_model_parallel_size={pp} over cluster.actor_num_nodes={c.actor_num_nodes} nodes: "
                    "megatron places each pipeline stage on nodes of its own, so an engine's node lacks the other stages' "
                    "ranks, and handles to their tensors open only on their own node: set cluster.colocate=false (update "
                    "groups reach other nodes), parallelism.pipeline_model_parallel_size=1, or cluster.actor_num_nodes=1"]
    if mode != "distributed" or c.device == "cpu" or not c.colocate:
        return []
    return [f"{NOT_YET} rollout.weight_sync=distributed with cluster.colocate=true on cluster.device={c.device} (a train "
            "rank and its engine share a GPU, and NCCL refuses two ranks of a group on one GPU): set "
            "rollout.weight_sync=auto (tensor when colocated), or cluster.colocate=false"]
