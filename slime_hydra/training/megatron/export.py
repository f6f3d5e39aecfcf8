"""A megatron GPT's weights out as Hugging Face's: named tensors for the rollout engines, and a checkpoint directory.

convert.megatron_to_hf renames and re-fuses this pipeline stage's shards; the tensor-parallel shards are gathered first
(a collective of the TP group), so every rank of a stage holds the stage's full tensors. What a rollout engine loads
when PP > 1 is every stage's, gathered onto the first stage; a checkpoint is one safetensors file per stage (with an
index when PP > 1) beside config.json and the tokenizer, written by one rank per stage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

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
        yield from convert.megatron_to_hf(local, r.model, gather=_gather_tp, tp_size=ps.get_tensor_model_parallel_world_size(),
                                          vocab_size=r.vocab_size, **r.layout)

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


def _gather_tp(t: torch.Tensor, dim: int) -> torch.Tensor:
    """`t`'s tensor-parallel shards concatenated along `dim` (a collective of the TP group)."""
    tp = ps.get_tensor_model_parallel_world_size()
    if tp == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(parts, t.contiguous(), group=ps.get_tensor_model_parallel_group())
    return torch.cat(parts, dim=dim)
