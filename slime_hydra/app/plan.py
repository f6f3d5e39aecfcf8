"""`slime-hydra plan [overrides...]`: the placement plan of a run, printed without starting anything.

A dry run for checking a 64-GPU layout before paying for it: no Ray, no model, no data loading, no GPU.
The config is composed and checked by the run's own preflight (app/checks.py); the layout is the
placement group's (orchestration/placement.py plan_layout, which imports no ray at module level); the
megatron groups are megatron's own RankGenerator with the order the ranks use (training/megatron/
parallel.py); the weight-sync mode is the engines' (rollout/sglang/checks.weight_sync_mode). What the
plan adds is only the printing. Two kinds of problem do not stop it: paths absent on this machine (a
recipe's checkpoint and data on the cluster it is for; errors.Missing), listed under "missing:", and
what the Ray engine does not drive yet (orchestration/checks.NOT_YET, refused at validation), listed
under "not runnable yet:", and a layout over the GPU's memory (app/memory.py, refused at validation), listed under
"does not fit:" below the memory table. Every other
problem exits 2 with the usual message, as a run would.

Node and GPU numbers assume identical nodes of `gpus_per_node` GPUs (`--gpus-per-node`; by default
max(8, cluster.actor_num_gpus_per_node), one machine for CPU bundles) filled in bundle order, as Ray's PACK
strategy fills them; the layout is checked against such nodes with the check a run makes against the
real cluster (placement.layout_problems). Ray places the bundles, so on other clusters numbers may differ.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Optional

from slime_hydra.app import memory
from slime_hydra.app.preflight import check_composed
from slime_hydra.config.compose import Composer, check_overrides
from slime_hydra.config.schema import RunConfig
from slime_hydra.errors import ConfigError, Missing, UserError
from slime_hydra.orchestration.checks import NOT_YET
from slime_hydra.orchestration.placement import Layout, layout_problems, plan_layout, resolve_use_gpu
from slime_hydra.orchestration.senders import engine_ranks, feeder_ranks, megatron_stages
from slime_hydra.rollout.sglang.checks import num_engines, weight_sync_mode

USAGE = ("usage: slime-hydra plan [group=option ...] [key=value ...] [--gpus-per-node N] [--config-name NAME]\n"
         "  prints the placement plan of that run (bundles, ranks and their TP/PP/DP groups, engines, memory, weight sync)\n"
         "  without starting anything; paths absent here are listed, not fatal; other config errors exit 2.\n"
         "  --gpus-per-node: the GPUs of each node of the cluster it is for (default max(8, cluster.actor_num_gpus_per_node))")


def compose_for_plan(overrides: list[str], config_name: str = "config") -> tuple[RunConfig, list[Missing], list[str]]:
    """(the checked config, paths missing here, what a run refuses that the plan shows: pairings not driven yet and the
    memory plan's verdict); raises ConfigError for anything else."""
    with Composer(config_name) as composer:
        composed, problems = check_overrides(composer, overrides)
    if composed is None or problems:
        raise ConfigError(problems)
    cfg, problems, _ = check_composed(composed)  # a run's preflight: typed config, then every check (app/checks.py)
    if cfg is None:
        raise ConfigError(problems)
    missing = [p for p in problems if isinstance(p, Missing)]
    not_yet = [p for p in problems if not isinstance(p, Missing) and p.startswith((NOT_YET, memory.REFUSED))]  # listed
    if other := [p for p in problems if p not in missing and p not in not_yet]:
        raise ConfigError(other)
    return cfg, missing, not_yet


def plan_text(overrides: list[str], config_name: str = "config", gpus_per_node: Optional[int] = None) -> str:
    """The plan, or ConfigError (exit 2) for a bad config or a layout that nodes of `gpus_per_node` cannot hold."""
    cfg, missing, not_yet = compose_for_plan(overrides, config_name)
    nodes = Nodes.of(cfg, gpus_per_node)
    what = " ".join(overrides) or "the default config"
    lines = [f"plan of {what} (nothing started: no Ray, no model, no data read)"]
    lines += cluster_lines(cfg, nodes) + train_lines(cfg, nodes) + rollout_lines(cfg, nodes) + memory.table(cfg) + sync_lines(cfg, nodes)
    if missing:
        lines += ["missing (on this machine; a run needs them where it runs):"]
        lines += [f"  {m.key}: {m.path}" for m in missing]
    if later := [p for p in not_yet if p.startswith(NOT_YET)]:
        lines += ["not runnable yet (a run stops with these before any actor starts, exit 2):"] + [f"  - {p}" for p in later]
    if over := [p for p in not_yet if p.startswith(memory.REFUSED)]:
        lines += ["does not fit (a run stops with these before anything starts, exit 2):"] + [f"  - {p}" for p in over]
    return "\n".join(lines)


# -- the placement group ------------------------------------------------------------------------
@dataclass(frozen=True)
class Nodes:
    """The run's Layout on identical nodes of `per` bundles, filled in bundle order."""

    layout: Layout
    kind: str  # GPU | CPU
    per: int

    @staticmethod
    def of(cfg: RunConfig, gpus_per_node: Optional[int]) -> "Nodes":
        """cluster.device=auto plans GPU bundles (the cluster a plan is for has GPUs; one without gets CPU bundles)."""
        c = cfg.cluster
        use_gpu = resolve_use_gpu(c, {"GPU": 1.0})
        layout = plan_layout(c, use_gpu)
        if c.backend != "ray":
            return Nodes(layout, "GPU" if use_gpu else "CPU", 1)
        if gpus_per_node is not None and gpus_per_node < 1:
            raise UserError(f"--gpus-per-node={gpus_per_node} must be >= 1")
        per = gpus_per_node or (max(8, c.actor_num_gpus_per_node) if use_gpu else layout.num_bundles)
        count = -(-layout.num_bundles // per)
        # the check a run makes against the cluster's resources (placement.create_placement_group), on the planned nodes
        total = {"GPU": float(count * per), "CPU": float(count * per)} if use_gpu else {"CPU": float(count * per)}
        if problems := layout_problems(c, layout, total, float(per), f"planned: {count} node(s) of {per}"):
            raise ConfigError(problems)
        return Nodes(layout, "GPU" if use_gpu else "CPU", per)

    def where(self, bundle: int) -> tuple[int, int]:
        """(node, device on that node) of a bundle."""
        return divmod(bundle, self.per)


def cluster_lines(cfg: RunConfig, nodes: Nodes) -> list[str]:
    c, layout, per, kind = cfg.cluster, nodes.layout, nodes.per, nodes.kind
    if c.backend != "ray":
        return [f"cluster: backend=local: one process (this driver) on cluster.device={c.device}; no placement group"]
    lines = [f"cluster: backend=ray, one placement group of {layout.num_bundles} bundle(s) of {layout.bundle} (PACK), "
             f"colocate={str(c.colocate).lower()}; train: cluster.actor_num_nodes × actor_num_gpus_per_node = "
             f"{c.actor_num_nodes} × {c.actor_num_gpus_per_node}; planned on nodes of {per} {kind}"]
    if c.device == "auto":
        lines.append("  (cluster.device=auto: on a Ray cluster without GPUs each bundle is {'CPU': 1.0})")
    for n in range(-(-layout.num_bundles // per)):
        bundles = range(n * per, min((n + 1) * per, layout.num_bundles))
        lines.append(f"  node {n}: bundles {bundles[0]}-{bundles[-1]} ({kind} {bundles[0] - n * per}-{bundles[-1] - n * per})")
    return lines


# -- train ranks ---------------------------------------------------------------------------------
def rank_coords(cfg: RunConfig, world: int) -> tuple[dict[str, list[list[int]]], str]:
    """The train ranks' groups by kind, and how they were formed."""
    if cfg.train.backend != "megatron":  # torch: every rank a data-parallel replica
        return {"dp": [list(range(world))]}, "train.backend=torch: data parallel only (the driver splits each batch)"
    with warnings.catch_warnings():  # megatron-core warns at import that Transformer Engine / Apex are absent
        warnings.simplefilter("ignore")
        # megatron-core (~6 s of imports) only for a megatron plan: its RankGenerator is what the ranks build groups with
        from slime_hydra.training.megatron.parallel import ORDER, rank_groups

        groups = rank_groups(cfg.parallelism, world)
    p = cfg.parallelism
    sizes = (f"TP={p.tensor_model_parallel_size} PP={p.pipeline_model_parallel_size} CP={p.context_parallel_size} "
             f"EP={p.expert_model_parallel_size} -> DP={len(groups['dp'][0])}")
    if "ep" in groups:  # the experts' grid over the same ranks: expert-TP × EP × expert-DP × PP
        etp = len(groups["etp"][0])
        sizes += f"; experts: ETP={etp} EP={p.expert_model_parallel_size} -> expert DP={world // (etp * len(groups['ep'][0]) * p.pipeline_model_parallel_size)}"
    return groups, f"train.backend=megatron: {sizes} (megatron's rank order {ORDER}: TP fastest)"


def train_lines(cfg: RunConfig, nodes: Nodes) -> list[str]:
    c, layout, kind = cfg.cluster, nodes.layout, nodes.kind
    if cfg.debug_rollout_only:
        return ["train: debug_rollout_only=true: no trainer built"]
    if c.backend != "ray":
        return [f"train: rank 0 of 1 ({cfg.train.backend}) in this process, TP=PP=DP=1"]
    world = len(layout.actor_bundles)
    groups, how = rank_coords(cfg, world)
    share = "half of" if layout.colocate else "all of"
    lines = [f"train: {world} rank(s), one Ray actor each on {share} its bundle; {how}"]
    kinds = [k for k in ("tp", "pp", "dp", "cp", "ep", "etp") if k in groups and (k not in ("cp", "etp") or len(groups[k][0]) > 1)]
    coords = {k: {r: i for g in groups[k] for i, r in enumerate(g)} for k in kinds}
    lines.append(("  rank  node  bundle  " + f"{kind:<5}" + "".join(f"{k.upper():<4}" for k in kinds)).rstrip())
    for r, b in enumerate(layout.actor_bundles):
        node, dev = nodes.where(b)
        lines.append(f"  {r:<4}  {node:<4}  {b:<6}  {dev:<5}" + "".join(f"{coords[k][r]:<4}" for k in kinds).rstrip())
    for k in kinds:
        lines.append(f"  {k.upper()} groups: " + " ".join(str(g) for g in groups[k]))
    return lines


# -- rollout engines -----------------------------------------------------------------------------
def router_words(r, own: str) -> str:
    """The router in front of the engines: `own` (the run starts it), or one already running that it registers them
    with."""
    if r.sglang_router_ip is not None:
        return (f"registered with the sglang-router already running at {r.sglang_router_ip}:{r.sglang_router_port} "
                "(rollout.sglang_router_ip/port: not started by this run; the engines removed from it at the end)")
    return own


def rollout_lines(cfg: RunConfig, nodes: Nodes) -> list[str]:
    c, r, layout, kind = cfg.cluster, cfg.rollout, nodes.layout, nodes.kind
    if cfg.load_debug_rollout_data:
        return [f"rollout: none (load_debug_rollout_data={cfg.load_debug_rollout_data}: samples replayed from dumps)"]
    if c.backend != "ray":
        if r.backend == "sglang" and r.rollout_external_engine_addrs:
            return [f"rollout: {len(r.rollout_external_engine_addrs)} SGLang server(s) already running, not started by "
                    f"this run (rollout.rollout_external_engine_addrs: {', '.join(map(str, r.rollout_external_engine_addrs))}), "
                    f"{router_words(r, f'behind an sglang-router of its own (policy {r.sglang_router_policy})')}; their weights reset to the "
                    "model's and checked before the first rollout"]
        if r.backend == "sglang":
            n = num_engines(c)
            return [f"rollout: {n} SGLang server(s) × {c.rollout_num_gpus_per_engine} device(s) (tp_size), child processes "
                    f"of this driver on cluster.device={c.device}, "
                    f"{router_words(r, f'behind sglang-router (policy {r.sglang_router_policy})')}"]
        return ["rollout: one local engine (rollout.backend=local) in this process"]
    placed = ("colocated on the train bundles" if c.colocate
              else f"on bundles of their own (cluster.rollout_num_gpus={c.rollout_num_gpus})")
    if r.backend == "sglang":
        head = (f"rollout: {len(layout.engine_bundles)} SGLang engine(s) × {c.rollout_num_gpus_per_engine} {kind} "
                f"(cluster.rollout_num_gpus_per_engine, the server's tp_size), {placed}, "
                f"{router_words(r, f'behind sglang-router (policy {r.sglang_router_policy}) in the driver')}; "
                "each server a child of a Ray actor on its first bundle")
    else:
        head = (f"rollout: {len(layout.engine_bundles)} local engine(s) (rollout.backend=local), one Ray actor each, {placed}; "
                "a rollout manager actor (no resources) owns them and the prompt source")
    lines = [head]
    for e, bundles in enumerate(layout.engine_bundles):
        spots = sorted({nodes.where(b) for b in bundles})
        on = sorted({n for n, _ in spots})
        devs = ",".join(str(d) for _, d in spots)
        spans = "; spans nodes: refused at launch (an engine's bundles must share a node)" if len(on) > 1 else ""
        lines.append(f"  engine {e}: bundles {list(bundles)} (node {','.join(map(str, on))}, {kind} {devs}{spans})")
    return lines


# -- weight sync ---------------------------------------------------------------------------------
def planned_senders(cfg: RunConfig, nodes: Nodes) -> tuple[Optional[list], Optional[list]]:
    """(engine_ranks, feeder_ranks) of orchestration/rank_weights.py on the planned nodes: per pipeline stage, the ranks
    that send each engine that stage's tensors."""
    layout = nodes.layout
    world = len(layout.actor_bundles)
    stages = megatron_stages(world, cfg.parallelism.pipeline_model_parallel_size) if cfg.train.backend == "megatron" else None
    node = {b: nodes.where(b)[0] for b in range(layout.num_bundles)}
    return (engine_ranks(layout.actor_bundles, layout.engine_bundles, stages, node),
            feeder_ranks(world, len(layout.engine_bundles), stages, [node[b] for b in layout.actor_bundles],
                         [node[bs[0]] for bs in layout.engine_bundles]))


def _per_stage(senders: list, engine: int, word: str) -> str:
    """`word` and the ranks of each stage that send engine `engine` its tensors ("rank 0"; "stage 0 rank 0 / stage 1 rank 2")."""
    def one(x) -> str:
        rs = x if isinstance(x, list) else [x]
        return f"{word}{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}"

    if len(senders) == 1:
        return one(senders[0][engine])
    return " / ".join(f"stage {s} {one(stage[engine])}" for s, stage in enumerate(senders))


def sync_lines(cfg: RunConfig, nodes: Nodes) -> list[str]:
    c, r, layout = cfg.cluster, cfg.rollout, nodes.layout
    if cfg.debug_rollout_only or cfg.load_debug_rollout_data:
        return ["weight sync: none (a debug split: nothing trains, or nothing generates)"]
    source = ("the trainer in this process" if c.backend != "ray" else
              "train rank 0's weights (megatron: every stage's TP-gathered Hugging Face tensors), fetched by the driver from "
              "the Ray object store (CPU tensors)")
    if r.backend != "sglang":
        if c.backend != "ray":
            return ["weight sync: in process: the trainer's tensors copied into the local engine's parameters"]
        return ["weight sync: train rank 0's weights into the Ray object store; the rollout manager actor hands the "
                "reference to each engine actor, which copies them into its parameters"]
    mode = weight_sync_mode(r.weight_sync, c.colocate)
    buckets = f"buckets of rollout.update_weight_buffer_size={r.update_weight_buffer_size} bytes"
    route = {"tensor": f"{buckets} posted to each engine's /update_weights_from_tensor as handles (shared-memory files for "
                       "CPU tensors, CUDA IPC for CUDA ones)",
             "distributed": f"{buckets} broadcast over one update group per engine (the driver its rank 0; gloo on CPU, "
                            "NCCL on GPU; /update_weights_from_distributed)",
             "disk": "a safetensors file the driver writes, then each engine's /update_weights_from_disk"}[mode]
    megatron = cfg.train.backend == "megatron"
    ranks, feeders = planned_senders(cfg, nodes) if c.backend == "ray" else (None, None)
    by = "by the driver"
    staged = "each pipeline stage's from its own ranks, " if megatron and cfg.parallelism.pipeline_model_parallel_size > 1 else ""
    own = (f"each train rank's own {'TP-gathered ' if megatron else ''}Hugging Face tensors, {staged}staged on its device "
           "(nothing through the object store)")
    if mode == "tensor" and ranks is not None:  # orchestration/rank_weights.py
        source = own
        where = "the train rank(s) on the engine's bundles" if len(ranks) == 1 else "train ranks of each stage on the engine's node"
        route = (f"{buckets}, each serialised by {where} ("
                 + "; ".join(f"engine {e}: {_per_stage(ranks, e, 'rank')}" for e in range(len(layout.engine_bundles)))
                 + ") as handles to their tensors (CUDA IPC on GPU, shared-memory files on CPU), posted to the engine's "
                 "/update_weights_from_tensor")
    elif mode == "distributed" and feeders is not None:  # orchestration/rank_weights.py
        source, by = own, "by the train ranks"
        backend = "NCCL from the rank's GPU" if layout.use_gpu else "gloo"
        route = (f"{buckets} broadcast over one update group per engine and stage ({backend}), its rank 0 the train rank "
                 "that feeds it, on the engine's node where it has one ("
                 + "; ".join(f"engine {e}: {_per_stage(feeders, e, 'rank')}" for e in range(len(layout.engine_bundles)))
                 + "); that rank opens the group (a new one when the engine is relaunched) and posts each bucket's "
                 "/update_weights_from_distributed, while the driver pauses and continues the engine; engines fed by different "
                 "ranks receive at once")
    check = "; each sync checked equal (rollout.check_weight_update_equal)" if r.check_weight_update_equal else ""
    return [f"weight sync: rollout.weight_sync={r.weight_sync} -> {mode} (cluster.colocate={str(c.colocate).lower()})",
            f"  from {source}", f"  {by}: {route}",
            f"  each engine paused, updated, cache flushed, continued; samples carry their weight version{check}"]


def main(overrides: list[str], config_name: str = "config", gpus_per_node: Optional[int] = None) -> int:
    """Print the plan; 0, or a UserError's exit code (2) with its message on stderr."""
    try:
        print(plan_text(overrides, config_name, gpus_per_node), flush=True)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    return 0
