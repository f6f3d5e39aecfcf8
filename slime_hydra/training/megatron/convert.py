"""HF <-> Megatron weights for the dense decoder families (qwen3, qwen2/2.5, llama), with TP/PP sharding.

Megatron's local GPTModel names and layouts (per pipeline stage, layers numbered locally):
  embedding.word_embeddings.weight        [V_pad/tp, h]    vocab rows split over TP (rows >= V are zero)
  decoder.layers.j.self_attention.linear_qkv.weight  [(np+2ng)hd/tp, h]: per query group g the
                                          group's q heads, then its k head, then its v head
  decoder.layers.j.self_attention.linear_proj.weight [h, np hd/tp]   (row parallel: columns split)
  decoder.layers.j.mlp.linear_fc1.weight  [2 ffn/tp, h]: this rank's gate rows, then its up rows
  decoder.layers.j.mlp.linear_fc2.weight  [h, ffn/tp]
  norms (input_layernorm, pre_mlp_layernorm, q/k_layernorm, decoder.final_layernorm) replicated
  output_layer.weight                      [V_pad/tp, h]  (untied, or the last stage's copy when tied with PP>1)
HF names are transformers' (`model.layers.i.self_attn.q_proj.weight`, ...), so an export loads with
`from_pretrained` and feeds the rollout engine's weight update by name. MoE and MLA families compose,
validate and build, but have no converter yet (`check_convertible` says so before anything loads).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator, Mapping

import torch

from slime_hydra.config.schema import ModelConfig

CONVERTIBLE = ("qwen3", "qwen2", "llama")


def check_convertible(m: ModelConfig) -> list[str]:
    if m.num_experts or m.multi_latent_attention or m.architecture not in CONVERTIBLE or m.post_self_attn_layernorm:
        return [f"model={m.name} (architecture={m.architecture}) has no HF<->Megatron converter yet (dense {list(CONVERTIBLE)} "
                "only): use train.backend=torch or one of model=qwen3_tiny,qwen3_0_6b,qwen3_4b,qwen3_8b,qwen2_5_7b,llama3_8b,llama3_70b"]
    return []


def _layer_rows(i: int, m: ModelConfig) -> list[tuple[str, tuple[str, ...], str]]:
    """(megatron suffix, HF names, kind) of layer i; kind says how the tensor is sharded / packed."""
    a, p = f"model.layers.{i}.self_attn.", f"model.layers.{i}."
    rows = [("input_layernorm.weight", (p + "input_layernorm.weight",), "copy"),
            ("self_attention.linear_qkv.weight", (a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"), "qkv"),
            ("self_attention.linear_proj.weight", (a + "o_proj.weight",), "row"),
            ("pre_mlp_layernorm.weight", (p + "post_attention_layernorm.weight",), "copy"),
            ("mlp.linear_fc1.weight", (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"), "fc1"),
            ("mlp.linear_fc2.weight", (p + "mlp.down_proj.weight",), "row")]
    if m.add_qkv_bias:
        rows.append(("self_attention.linear_qkv.bias", (a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"), "qkv"))
    if m.qk_layernorm:
        rows += [("self_attention.q_layernorm.weight", (a + "q_norm.weight",), "copy"),
                 ("self_attention.k_layernorm.weight", (a + "k_norm.weight",), "copy")]
    return rows


def _pack_qkv(q, k, v, m: ModelConfig):
    ng, hd = m.num_query_groups, m.kv_channels
    tail = q.shape[1:]
    q = q.reshape(ng, -1, *tail)  # [ng, (np/ng) hd, ...]
    return torch.cat([q, k.reshape(ng, hd, *tail), v.reshape(ng, hd, *tail)], dim=1).reshape(-1, *tail)


def _unpack_qkv(w, m: ModelConfig):
    ng, hd = m.num_query_groups, m.kv_channels
    per = m.num_attention_heads // ng * hd
    g = w.reshape(ng, per + 2 * hd, *w.shape[1:])
    flat = lambda t: t.reshape(-1, *w.shape[1:])  # noqa: E731
    return flat(g[:, :per]), flat(g[:, per : per + hd]), flat(g[:, per + hd :])


def _pad_vocab(w, v_pad: int):
    return torch.cat([w, w.new_zeros(v_pad - w.shape[0], *w.shape[1:])]) if v_pad > w.shape[0] else w


def hf_to_megatron(hf: Mapping[str, torch.Tensor], m: ModelConfig, *, tp_rank: int, tp_size: int, layer_offset: int,
                   num_local_layers: int, pre_process: bool, post_process: bool, v_pad: int) -> dict[str, torch.Tensor]:
    """This rank's shard of every tensor, keyed by the local GPTModel's state-dict names."""
    shard = lambda t, dim=0: t.chunk(tp_size, dim=dim)[tp_rank].contiguous()  # noqa: E731
    out: dict[str, torch.Tensor] = {}
    if pre_process:
        out["embedding.word_embeddings.weight"] = shard(_pad_vocab(hf["model.embed_tokens.weight"], v_pad))
    for j in range(num_local_layers):
        for suffix, names, kind in _layer_rows(layer_offset + j, m):
            ts = [hf[n] for n in names]
            if kind == "copy":
                t = ts[0]
            elif kind == "row":
                t = shard(ts[0], 1)
            elif kind == "qkv":
                t = shard(_pack_qkv(*ts, m))  # contiguous query groups per rank
            else:  # fc1: gate and up are split separately, then stacked per rank
                t = torch.cat([shard(ts[0]), shard(ts[1])])
            out[f"decoder.layers.{j}.{suffix}"] = t
    if post_process:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        head = hf["lm_head.weight"] if m.untie_embeddings_and_output_weights else hf["model.embed_tokens.weight"]
        if m.untie_embeddings_and_output_weights or not pre_process:
            out["output_layer.weight"] = shard(_pad_vocab(head, v_pad))
    return out


def megatron_to_hf(local: Mapping[str, torch.Tensor], m: ModelConfig, *, gather: Callable[[torch.Tensor, int], torch.Tensor],
                   tp_size: int, layer_offset: int, num_local_layers: int, pre_process: bool, post_process: bool,
                   vocab_size: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Full HF tensors of this pipeline stage. `gather(t, dim)` concatenates the TP shards along dim."""
    if pre_process:
        yield "model.embed_tokens.weight", gather(local["embedding.word_embeddings.weight"], 0)[:vocab_size]
    for j in range(num_local_layers):
        for suffix, names, kind in _layer_rows(layer_offset + j, m):
            t = local[f"decoder.layers.{j}.{suffix}"]
            if kind == "copy":
                yield names[0], t
            elif kind == "row":
                yield names[0], gather(t, 1)
            elif kind == "qkv":
                yield from zip(names, _unpack_qkv(gather(t, 0), m))
            else:  # fc1: each rank holds [gate_r; up_r]
                shards = gather(t, 0).chunk(tp_size)
                gate = torch.cat([s.chunk(2)[0] for s in shards])
                up = torch.cat([s.chunk(2)[1] for s in shards])
                yield names[0], gate
                yield names[1], up
    if post_process:
        yield "model.norm.weight", local["decoder.final_layernorm.weight"]
        if m.untie_embeddings_and_output_weights:
            yield "lm_head.weight", gather(local["output_layer.weight"], 0)[:vocab_size]


class SafetensorsDir(Mapping):
    """A lazy name -> tensor view of an HF checkpoint directory (model.safetensors or a sharded index)."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        self.path = Path(path)
        index = self.path / "model.safetensors.index.json"
        files = json.loads(index.read_text())["weight_map"] if index.is_file() else None
        if files is None:
            single = self.path / "model.safetensors"
            with safe_open(single, "pt") as f:
                files = {k: "model.safetensors" for k in f.keys()}
        self.files = files
        self._open = {}
        self._safe_open = safe_open

    def __getitem__(self, name: str) -> torch.Tensor:
        fname = self.files[name]
        if fname not in self._open:
            self._open[fname] = self._safe_open(self.path / fname, "pt")
        return self._open[fname].get_tensor(name)

    def __iter__(self):
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)
