"""Which train rank sends which pipeline stage's weights to which engine (orchestration/senders.py), on layouts derived
by hand. Megatron's rank order puts PP slowest: with 4 ranks and PP=2, ranks 0, 1 are stage 0 and ranks 2, 3 stage 1."""

from __future__ import annotations

from slime_hydra.orchestration.senders import engine_ranks, feeder_ranks, megatron_stages


def test_megatron_stages_put_pp_slowest():
    assert megatron_stages(4, 2) == [0, 0, 1, 1]
    assert megatron_stages(2, 2) == [0, 1]
    assert megatron_stages(16, 2) == [0] * 8 + [1] * 8
    assert megatron_stages(3, 1) == [0, 0, 0]


def test_colocated_engines_take_the_ranks_on_their_bundles_with_one_stage():
    # 4 ranks on bundles 0-3, two engines of 2 bundles: each engine TP rank gets the rank on its own bundle
    assert engine_ranks((0, 1, 2, 3), ((0, 1), (2, 3))) == [[[0, 1], [2, 3]]]
    # engines on bundles of their own (disaggregated): no rank shares them, so no handles
    assert engine_ranks((0, 1), ((2,), (3,))) is None


def test_colocated_engines_with_two_stages_on_one_node():
    # stage 0 = ranks 0, 1 (bundles 0, 1), stage 1 = ranks 2, 3 (bundles 2, 3), all on one node. Engine 0 (bundles 0, 1)
    # holds stage 0 itself (ranks 0, 1) and takes stage 1 from the node's stage-1 ranks in turn (2, 3); engine 1 the other way
    stages = megatron_stages(4, 2)
    assert engine_ranks((0, 1, 2, 3), ((0, 1), (2, 3)), stages) == [[[0, 1], [0, 1]], [[2, 3], [2, 3]]]
    # on two nodes of 2 bundles each node holds one stage: engine 0's node has no stage-1 rank, handles cannot cross
    assert engine_ranks((0, 1, 2, 3), ((0, 1), (2, 3)), stages, {b: b // 2 for b in range(4)}) is None


def test_feeders_spread_each_stages_engines_over_its_ranks():
    # one stage: engine e fed by rank e % 4
    assert feeder_ranks(4, 4) == [[0, 1, 2, 3]]
    assert feeder_ranks(2, 3) == [[0, 1, 0]]
    # two stages: engine e fed by stage 0's ranks [0, 1] in turn, and by stage 1's [2, 3]
    assert feeder_ranks(4, 4, megatron_stages(4, 2)) == [[0, 1, 0, 1], [2, 3, 2, 3]]
    assert feeder_ranks(0, 2) is None


def test_feeders_are_taken_from_the_engines_node_where_it_has_ranks():
    # ranks 0, 1 on node A, 2, 3 on node B (one stage); engine 0 on A takes 0 % 2 of [0, 1] = 0, engine 1 on B takes
    # 1 % 2 of [2, 3] = 3
    assert feeder_ranks(4, 2, None, ["A", "A", "B", "B"], ["A", "B"]) == [[0, 3]]
    # PP=2 ranks on node A, the engine on node B: no rank there, so each stage's first rank
    assert feeder_ranks(2, 1, [0, 1], ["A", "A"], ["B"]) == [[0], [1]]
