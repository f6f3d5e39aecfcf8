"""A megatron GPT's weights out as Hugging Face's: named tensors for the rollout engines, and a checkpoint directory.

convert.megatron_to_hf renames and re-fuses this pipeline stage's shards; the tensor-parallel shards are gathered first
(a collective of the TP group), so every rank of a stage holds the stage's full tensors. With expert parallelism each
routed expert is gathered over the EP group (and its expert-TP shards over that group) under its global index, one local
expert index at a time, so every rank also holds every expert: each is gathered once, when the export reaches it. What a rollout engine loads
when PP > 1 is every stage's, gathered onto the first stage; a checkpoint is one safetensors file per stage (with an
index when PP > 1) beside config.json and the tokenizer, written by one rank per stage.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator, Mapping

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

from slime_hydra.training.megatron import convert
from slime_hydra.training.megatron.runner import MegatronRunner


class HFExport:
    def __init__(self, runner: MegatronRunner, hf_config):
        """runner: the layout of the GPTs exported; hf_config: the HF model's transformers config (config.json)."""
        self.runner, self.hf_config = runner, hf_config

    def named_weights(self, gpt: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """HF names and full (TP-gathered) tensors of this pipeline stage's weights of `gpt`."""
        r = self.runner
        local = {k: v.detach() for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}
        ep = ps.get_expert_model_parallel_world_size() if r.model.num_experts else 1
        if ep > 1:
            local = ExpertsOverEP(local, r.model.num_experts // ep)
        yield from convert.megatron_to_hf(local, r.model, gather=_gather_tp, tp_size=ps.get_tensor_model_parallel_world_size(),
                                          vocab_size=r.vocab_size, ep_size=ep, gather_expert=_gather_etp,
                                          etp_size=ps.get_expert_tensor_parallel_world_size(), **r.layout)

    def all_stages(self, gpt: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
        """Collective: HF names and full CPU tensors of the whole model (every pipeline stage's, TP-gathered) on the first
        stage's ranks; the other stages get []. What a rollout engine loads when PP > 1."""
        mine = [(k, v.cpu()) for k, v in self.named_weights(gpt)]  # every TP rank joins the gather
        pp = ps.get_pipeline_model_parallel_world_size()
        if pp == 1:
            return mine
        parts = [None] * pp if ps.is_pipeline_first_stage() else None
        dist.gather_object(mine, parts, dst=ps.get_pipeline_model_parallel_first_rank(),
                           group=ps.get_pipeline_model_parallel_group())
        return [kv for part in parts for kv in part] if parts is not None else []

    def save(self, gpt: torch.nn.Module, path: str, tokenizer=None) -> None:
        """Collective: config.json + safetensors (one file per pipeline stage, with an index when PP>1) + tokenizer."""
        from safetensors.torch import save_file

        weights = {k: v.cpu().contiguous() for k, v in self.named_weights(gpt)}  # every TP rank joins the gather
        pp, stage = ps.get_pipeline_model_parallel_world_size(), ps.get_pipeline_model_parallel_rank()
        writer = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
        out = Path(path)
        name = "model.safetensors" if pp == 1 else f"model-{stage + 1:05d}-of-{pp:05d}.safetensors"
        if writer:
            out.mkdir(parents=True, exist_ok=True)
            save_file(weights, str(out / name), metadata={"format": "pt"})
        if pp > 1:
            maps = [None] * pp
            dist.all_gather_object(maps, {k: name for k in weights} if writer else {}, group=ps.get_pipeline_model_parallel_group())
            if writer and stage == 0:
                index = {"metadata": {}, "weight_map": {k: f for m in maps for k, f in m.items()}}
                (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
        if writer and stage == 0:
            self.hf_config.save_pretrained(str(out))
            if tokenizer is not None:
                tokenizer.save_pretrained(str(out))
        if dist.get_world_size() > 1:
            dist.barrier()


def _all_gather(t: torch.Tensor, group, size: int) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def _gather_tp(t: torch.Tensor, dim: int) -> torch.Tensor:
    """`t`'s tensor-parallel shards concatenated along `dim` (a collective of the TP group)."""
    tp = ps.get_tensor_model_parallel_world_size()
    return t if tp == 1 else torch.cat(_all_gather(t, ps.get_tensor_model_parallel_group(), tp), dim=dim)


def _gather_etp(t: torch.Tensor, dim: int) -> torch.Tensor:
    """A routed expert's expert-tensor-parallel shards concatenated along `dim` (a collective of the expert-TP group)."""
    etp = ps.get_expert_tensor_parallel_world_size()
    return t if etp == 1 else torch.cat(_all_gather(t, ps.get_expert_tensor_parallel_group(), etp), dim=dim)


_EXPERT = re.compile(r"^(.*\.local_experts\.)(\d+)(\..*)$")


class ExpertsOverEP(Mapping):
    """A stage's state dict with every global routed expert: `local_experts.{r*n_local+j}` is EP rank r's
    `local_experts.{j}`. Reading one gathers local index j over the EP group (a collective: every rank reads in the same
    order, convert.expert_order's) and keeps the other ranks' pieces until they are read, which that order makes next."""

    def __init__(self, local: Mapping[str, torch.Tensor], n_local: int):
        self.local, self.n_local, self.pending = local, n_local, {}

    def __getitem__(self, key: str) -> torch.Tensor:
        m = _EXPERT.match(key)
        if m is None:
            return self.local[key]
        if key not in self.pending:
            j = int(m[2]) % self.n_local
            parts = _all_gather(self.local[f"{m[1]}{j}{m[3]}"], ps.get_expert_model_parallel_group(),
                                ps.get_expert_model_parallel_world_size())
            self.pending |= {f"{m[1]}{r * self.n_local + j}{m[3]}": t for r, t in enumerate(parts)}
        return self.pending.pop(key)

    def __iter__(self):
        return iter(self.local)

    def __len__(self) -> int:
        return len(self.local)
