"""HF <-> Megatron conversion of the MoE, MLA and glm4 families on tiny random HF models (tests/support/megatron_cpu/zoo.py).

qwen3_moe stands for qwen3-30B-A3B, deepseek_v3 (MLA with query compression, a dense first layer, shared
experts, sigmoid router with expert bias) for deepseek-v3 / kimi-k2, moonlight for MLA without query
compression, glm4 for its fused gate_up_proj, qkv bias, half-dim interleaved rope and post norms.
The round trips are tensor-only (no megatron import); the logits parity runs megatron on CPU under the shim.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.megatron_cpu import zoo

FAMILIES = list(zoo.FAMILIES)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = {}
    for fam in FAMILIES:
        d = tmp_path_factory.mktemp(fam)
        out[fam] = (*zoo.build(fam, d), d)
    return out


def _round_trip(disk, m, tp: int) -> dict:
    """hf_to_megatron for every TP rank, then megatron_to_hf with a gather that concatenates the ranks' shards."""
    from slime_hydra.training.megatron import convert

    layout = dict(layer_offset=0, num_local_layers=m.num_layers, pre_process=True, post_process=True)
    shards = [convert.hf_to_megatron(disk, m, tp_rank=r, tp_size=tp, v_pad=64, **layout) for r in range(tp)]
    key_of = {id(t): k for k, t in shards[0].items()}

    def gather(t, dim):
        return torch.cat([s[key_of[id(t)]] for s in shards], dim)

    return dict(convert.megatron_to_hf(shards[0], m, gather=gather, tp_size=tp, vocab_size=64, **layout))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("family", FAMILIES)
def test_hf_megatron_hf_round_trip_is_exact(built, family, tp):
    from slime_hydra.training.megatron import convert

    cfg, _, d = built[family]
    disk = convert.SafetensorsDir(d)  # the checkpoint's names: one per expert
    back = _round_trip(disk, cfg.model, tp)
    assert set(back) == set(disk)
    for k in disk:
        assert torch.equal(back[k], disk[k]), k


@pytest.mark.parametrize("family", FAMILIES)
def test_in_memory_weights_map_to_checkpoint_names(built, family):
    """transformers 5 fuses a MoE layer's experts in memory; hub_names gives the per-expert checkpoint view."""
    from slime_hydra.models.hf_check import check_hf_config
    from slime_hydra.training.megatron import convert

    cfg, hf, d = built[family]
    disk, mem = convert.SafetensorsDir(d), convert.hub_names(hf.state_dict())
    assert set(mem) == set(disk)
    assert all(torch.equal(mem[k], disk[k]) for k in disk)
    assert check_hf_config(cfg.model, d) == []  # the option's fields match the tiny config.json one by one


@pytest.fixture(scope="module")
def megatron_logprobs(built):
    from tests.support.megatron_cpu import shim, workers

    shim.install()
    from slime_hydra.training.megatron import convert
    from tests.support.trainers import megatron_backend

    out = {}
    for fam in FAMILIES:
        cfg, hf, d = built[fam]
        b = megatron_backend(convert.SafetensorsDir(d), hf.config, cfg.model, cfg.parallelism, cfg.algorithm, cfg.train,
                                 1.0, 10, torch.device("cpu"), seed=cfg.seed)
        out[fam] = b.compute_log_probs(workers.fixed_batch())
        with torch.no_grad():  # and the export of what megatron holds is the checkpoint, exactly
            exported = dict(b.named_weights())
        disk = convert.SafetensorsDir(d)
        out[fam + "/export_exact"] = set(exported) == set(disk) and all(torch.equal(exported[k], disk[k]) for k in disk)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(built, megatron_logprobs, family):
    from slime_hydra.algorithms.losses import log_probs_from_logits
    from tests.support.megatron_cpu import workers

    _, hf, _ = built[family]
    batch = workers.fixed_batch()
    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    ref = log_probs_from_logits(logits, batch.input_ids[:, 1:])
    mask = batch.attention_mask[:, 1:].bool()
    # fp32 on both sides: only summation orders differ (measured here: 4.8e-7 for qwen3_moe, deepseek_v3 with
    # yarn factor 40, glm4; 7.2e-5 for moonlight, whose router scores pass through a sigmoid of larger logits)
    assert (megatron_logprobs[family][mask] - ref[mask]).abs().max() < 2e-4
    assert megatron_logprobs[family + "/export_exact"]


MOE_FAMILIES = [f for f in FAMILIES if f != "glm4"]


@pytest.mark.parametrize("ep, etp", [(2, 1), (4, 1), (2, 2)])
@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_expert_parallel_round_trip_is_exact(built, family, ep, etp):
    """Per EP rank r (and expert-TP rank): local expert j is global expert r*E_local + j, each split like a dense MLP
    over expert TP. The export reads every global expert by its global index (export.ExpertsOverEP gathers them over the
    EP group; here each global index is read from its rank's local one), and gives back the checkpoint exactly."""
    from slime_hydra.training.megatron import convert

    cfg, _, d = built[family]
    m, disk = cfg.model, convert.SafetensorsDir(d)
    layout = dict(layer_offset=0, num_local_layers=m.num_layers, pre_process=True, post_process=True)
    shards = {(r, e): convert.hf_to_megatron(disk, m, tp_rank=e, tp_size=etp, v_pad=64, ep_rank=r, ep_size=ep,
                                             etp_rank=e, etp_size=etp, **layout) for r in range(ep) for e in range(etp)}
    n_local = m.num_experts // ep
    assert sum(".local_experts." in k and k.endswith("linear_fc2.weight") for k in shards[0, 0]) == n_local * sum(
        convert.moe_layer_pattern(m.moe_layer_freq, m.num_layers))
    # EP rank 1's local expert 0 is global expert n_local: its down projection, expert-TP rank 0's columns
    layer = next(i for i in range(m.num_layers) if convert.moe_layer_pattern(m.moe_layer_freq, m.num_layers)[i])
    down = disk[f"model.layers.{layer}.mlp.experts.{n_local}.down_proj.weight"]
    assert torch.equal(shards[1, 0][f"decoder.layers.{layer}.mlp.experts.local_experts.0.linear_fc2.weight"],
                       down.chunk(etp, dim=1)[0])

    def global_view(e_rank: int) -> dict:  # what ExpertsOverEP presents on expert-TP rank e_rank
        out = dict(shards[0, e_rank])
        for r in range(ep):
            for k, t in shards[r, e_rank].items():
                if ".local_experts." in k:
                    head, rest = k.split(".local_experts.")
                    j, tail = rest.split(".", 1)
                    out[f"{head}.local_experts.{r * n_local + int(j)}.{tail}"] = t
        return out

    views = [global_view(e) for e in range(etp)]
    key_of = {id(t): k for k, t in views[0].items()}
    gather = lambda t, dim: torch.cat([v[key_of[id(t)]] for v in views], dim)  # noqa: E731
    back = dict(convert.megatron_to_hf(views[0], m, gather=gather, tp_size=etp, vocab_size=64, ep_size=ep,
                                       gather_expert=gather, etp_size=etp, **layout))
    assert set(back) == set(disk)
    for k in disk:
        assert torch.equal(back[k], disk[k]), k
