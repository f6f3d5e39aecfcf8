"""Which train rank sends which pipeline stage's weights to which SGLang engine: pure, no torch or ray (the plan, the
checks and the Ray train groups read it; orchestration/rank_weights.py sends by it).

Every rank of a stage holds the stage's whole Hugging Face tensors after the TP gather. A colocated engine's TP rank gets
handles from the rank on its own bundle for that rank's stage, and from a rank of each other stage on the same node
(handles open only on their own host); an engine over update groups gets each stage from one rank of the stage, on the
engine's node where it has one, the engines spread over the stage's ranks. Megatron's rank order puts PP slowest
(tp-cp-ep-dp-pp), so rank r's stage is r // (ranks / PP): `megatron_stages`.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Optional, Sequence


def megatron_stages(num_ranks: int, pipeline_stages: int) -> list[int]:
    """Rank r's pipeline stage under megatron's rank order (PP slowest)."""
    per = max(num_ranks // max(pipeline_stages, 1), 1)
    return [r // per for r in range(num_ranks)]


def _by_stage(stages: Optional[Sequence[int]], num_ranks: int) -> list[list[int]]:
    """The ranks of each pipeline stage, in rank order (every rank stage 0 where `stages` is None)."""
    stages = list(stages) if stages is not None else [0] * num_ranks
    return [[r for r in range(num_ranks) if stages[r] == s] for s in range(max(stages, default=0) + 1)]


def engine_ranks(actor_bundles: tuple[int, ...], engine_bundles: tuple[tuple[int, ...], ...],
                 stages: Optional[Sequence[int]] = None,
                 node_of: Optional[Mapping[int, Hashable]] = None) -> Optional[list[list[list[int]]]]:
    """[stage][engine][engine TP rank]: the train rank whose handles to its stage's tensors that TP rank of the engine
    gets. The rank on the TP rank's own bundle for its own stage; for another stage, a rank of that stage on the same
    node (handles open only on their own host), the node's ranks of the stage taken in turn over the TP ranks.
    stages[r]: rank r's pipeline stage (all 0 if None); node_of[b]: bundle b's node (one node if None). None where the
    ranks cannot send: an engine has a bundle with no train rank (the engines are not colocated with the ranks), or a
    stage has no rank on an engine's node."""
    rank_of = {b: r for r, b in enumerate(actor_bundles)}
    if any(b not in rank_of for bundles in engine_bundles for b in bundles):
        return None
    node = (lambda b: node_of[b]) if node_of is not None else (lambda b: 0)
    by_stage = _by_stage(stages, len(actor_bundles))
    out = []
    for s, members in enumerate(by_stage):
        per_engine = []
        for bundles in engine_bundles:
            tp_ranks = []
            for i, b in enumerate(bundles):
                here = [r for r in members if node(actor_bundles[r]) == node(b)]
                if not here:
                    return None
                tp_ranks.append(rank_of[b] if rank_of[b] in members else here[i % len(here)])
            per_engine.append(tp_ranks)
        out.append(per_engine)
    return out


def feeder_ranks(num_ranks: int, num_engines: int, stages: Optional[Sequence[int]] = None,
                 rank_nodes: Optional[Sequence[Hashable]] = None,
                 engine_nodes: Optional[Sequence[Hashable]] = None) -> Optional[list[list[int]]]:
    """[stage][engine]: the train rank of that pipeline stage that opens engine e's update group for the stage and
    broadcasts the stage's tensors to it. Every rank of a stage holds the stage's whole tensors after the TP gather, so
    the engines are spread over them (engine e: the e % n-th), taking the ranks on the engine's own node where it has
    some (rank_nodes[r], engine_nodes[e]; one node if None), else all of the stage's. None without ranks."""
    if num_ranks < 1:
        return None
    out = []
    for members in _by_stage(stages, num_ranks):
        per_engine = []
        for e in range(num_engines):
            here = [r for r in members if rank_nodes is None or engine_nodes is None or rank_nodes[r] == engine_nodes[e]]
            pool = here or members
            per_engine.append(pool[e % len(pool)])
        out.append(per_engine)
    return out
