"""HF <-> Megatron weights with TP/PP sharding: dense (qwen3, qwen2/2.5, llama), glm4, MoE (qwen3_moe) and
MLA + MoE (deepseek_v3: deepseek-v3, moonlight, kimi-k2).

Megatron's local GPTModel names and layouts (per pipeline stage, layers numbered locally):
  embedding.word_embeddings.weight        [V_pad/tp, h]    vocab rows split over TP (rows >= V are zero)
  decoder.layers.j.self_attention.linear_qkv.weight  [(np+2ng)hd/tp, h]: per query group g the
                                          group's q heads, then its k head, then its v head
  decoder.layers.j.self_attention.linear_proj.weight [h, np hd/tp]   (row parallel: columns split)
  decoder.layers.j.mlp.linear_fc1.weight  [2 ffn/tp, h]: this rank's gate rows, then its up rows
  decoder.layers.j.mlp.linear_fc2.weight  [h, ffn/tp]
  MoE layers: mlp.router.weight [E, h] (+ router.expert_bias [E]), mlp.experts.local_experts.e.linear_fc1/2
          (each expert laid out as the dense MLP), mlp.shared_experts.linear_fc1/2
  MLA: self_attention.linear_q_down_proj / linear_q_up_proj (or linear_q_proj) / linear_kv_down_proj /
          linear_kv_up_proj, column parallel (rows split), q_layernorm / kv_layernorm replicated
  glm4: self_attention.post_self_attn_layernorm, mlp.post_mlp_layernorm (model.PostNorm*)
  norms (input_layernorm, pre_mlp_layernorm, q/k_layernorm, decoder.final_layernorm) replicated
  output_layer.weight                      [V_pad/tp, h]  (untied, or the last stage's copy when tied with PP>1)
HF names are the checkpoints' (`model.layers.i.self_attn.q_proj.weight`, one name per expert), so an
export loads with `from_pretrained` and feeds the rollout engine's weight update by name.
Expert parallelism: EP rank r holds global experts r*E_local .. (r+1)*E_local-1 as local_experts.0 .. E_local-1
(megatron's SequentialMLP numbering), each sharded over the expert-tensor-parallel group (expert_tensor_parallel_size;
shared experts follow TP). An export names every global expert: the caller hands megatron_to_hf a mapping whose
`local_experts.{e}` keys are global (export.py gathers them over the EP group, one local index at a time).
Left out: grouped-GEMM expert layouts (TE / grouped_gemm): `check_convertible` says so before anything loads.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator, Mapping

import torch

from slime_hydra.config.schema import ModelConfig
from slime_hydra.models.hf_check import moe_layer_pattern
from slime_hydra.models.hf_names import hub_names  # noqa: F401  (convert.hub_names: the loader's view of HF weights)

CONVERTIBLE = ("qwen3", "qwen2", "llama", "qwen3_moe", "deepseek_v3", "kimi_k2", "glm4")


def check_convertible(m: ModelConfig) -> list[str]:
    problems = []
    if m.architecture not in CONVERTIBLE:
        problems.append(f"model={m.name} (architecture={m.architecture}) has no HF<->Megatron converter (one of "
                        f"{list(CONVERTIBLE)}): use train.backend=torch")
    if m.moe_grouped_gemm:
        problems.append("model.moe_grouped_gemm=true needs Transformer Engine's (or the grouped_gemm package's) grouped GEMM, "
                        "which this backend does not use; set model.moe_grouped_gemm=false (one GEMM per expert)")
    if m.post_self_attn_layernorm != m.post_mlp_layernorm:
        problems.append("model.post_self_attn_layernorm and model.post_mlp_layernorm come together (glm4); set both")
    return problems


def _layer_rows(i: int, m: ModelConfig, experts: tuple[int, int] = (0, 1)) -> list[tuple[str, tuple[str, ...], str]]:
    """(megatron suffix, HF names, kind) of layer i; kind says how the tensor is sharded / packed (an `e_` kind: over the
    expert-tensor-parallel group). experts: (EP rank, EP size) whose local experts the rows name (import), or (None,
    EP size): every global expert under its global index, in local-index-major order (export)."""
    p = f"model.layers.{i}."
    rows = [("input_layernorm.weight", (p + "input_layernorm.weight",), "copy"), *_attention_rows(i, m),
            ("pre_mlp_layernorm.weight", (p + "post_attention_layernorm.weight",), "copy"), *_mlp_rows(i, m, experts)]
    if m.post_self_attn_layernorm:  # glm4 (model.PostNormSelfAttention / PostNormMLP)
        rows += [("self_attention.post_self_attn_layernorm.weight", (p + "post_self_attn_layernorm.weight",), "copy"),
                 ("mlp.post_mlp_layernorm.weight", (p + "post_mlp_layernorm.weight",), "copy")]
    return rows


def _attention_rows(i: int, m: ModelConfig) -> list[tuple[str, tuple[str, ...], str]]:
    a = f"model.layers.{i}.self_attn."
    if m.multi_latent_attention:  # per head, q is [nope; rope] and kv_up is [k nope; v] on both sides: no repacking
        q = ([("self_attention.linear_q_down_proj.weight", (a + "q_a_proj.weight",), "col"),
              ("self_attention.q_layernorm.weight", (a + "q_a_layernorm.weight",), "copy"),
              ("self_attention.linear_q_up_proj.weight", (a + "q_b_proj.weight",), "col")]
             if m.q_lora_rank else [("self_attention.linear_q_proj.weight", (a + "q_proj.weight",), "col")])
        return q + [("self_attention.linear_kv_down_proj.weight", (a + "kv_a_proj_with_mqa.weight",), "col"),
                    ("self_attention.kv_layernorm.weight", (a + "kv_a_layernorm.weight",), "copy"),
                    ("self_attention.linear_kv_up_proj.weight", (a + "kv_b_proj.weight",), "col"),
                    ("self_attention.linear_proj.weight", (a + "o_proj.weight",), "row")]
    rows = [("self_attention.linear_qkv.weight", (a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"), "qkv"),
            ("self_attention.linear_proj.weight", (a + "o_proj.weight",), "row")]
    if m.add_qkv_bias:
        rows.append(("self_attention.linear_qkv.bias", (a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"), "qkv"))
    if m.qk_layernorm:
        rows += [("self_attention.q_layernorm.weight", (a + "q_norm.weight",), "copy"),
                 ("self_attention.k_layernorm.weight", (a + "k_norm.weight",), "copy")]
    return rows


def _ffn_rows(meg: str, hf: str, fused_gate_up: bool = False, expert: bool = False) -> list[tuple[str, tuple[str, ...], str]]:
    e = "e_" if expert else ""
    fc1 = (f"{meg}linear_fc1.weight", (f"{hf}gate_up_proj.weight",), "fc1_fused") if fused_gate_up else (
        f"{meg}linear_fc1.weight", (f"{hf}gate_proj.weight", f"{hf}up_proj.weight"), e + "fc1")
    return [fc1, (f"{meg}linear_fc2.weight", (f"{hf}down_proj.weight",), e + "row")]


def expert_order(num_experts: int, ep_rank: int | None, ep_size: int) -> list[tuple[int, int]]:
    """(megatron local_experts index, HF global expert) pairs: EP rank r's own (local j is global r*E_local+j), or with
    ep_rank None every global expert as (global, global), local index j of every rank before j+1 (export order)."""
    n = num_experts // ep_size
    if ep_rank is not None:
        return [(j, ep_rank * n + j) for j in range(n)]
    return [(r * n + j, r * n + j) for j in range(n) for r in range(ep_size)]


def _mlp_rows(i: int, m: ModelConfig, experts: tuple[int | None, int] = (0, 1)) -> list[tuple[str, tuple[str, ...], str]]:
    p = f"model.layers.{i}.mlp."
    if not m.num_experts or not moe_layer_pattern(m.moe_layer_freq, m.num_layers)[i]:
        return _ffn_rows("mlp.", p, fused_gate_up=m.architecture == "glm4")
    rows = [("mlp.router.weight", (p + "gate.weight",), "copy")]
    if m.moe_router_enable_expert_bias:
        rows.append(("mlp.router.expert_bias", (p + "gate.e_score_correction_bias",), "copy"))
    for j, e in expert_order(m.num_experts, *experts):  # SequentialMLP: one dense MLP per expert
        rows += _ffn_rows(f"mlp.experts.local_experts.{j}.", f"{p}experts.{e}.", expert=True)
    if m.moe_shared_expert_intermediate_size:
        rows += _ffn_rows("mlp.shared_experts.", f"{p}shared_experts.")
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
                   num_local_layers: int, pre_process: bool, post_process: bool, v_pad: int, ep_rank: int = 0, ep_size: int = 1,
                   etp_rank: int | None = None, etp_size: int | None = None) -> dict[str, torch.Tensor]:
    """This rank's shard of every tensor, keyed by the local GPTModel's state-dict names: its TP shard, and of the routed
    experts its EP rank's own, each its expert-TP shard (etp: default the TP rank and size)."""
    etp_rank, etp_size = (tp_rank, tp_size) if etp_size is None else (etp_rank, etp_size)
    shard = lambda t, dim=0: t.chunk(tp_size, dim=dim)[tp_rank].contiguous()  # noqa: E731
    eshard = lambda t, dim=0: t.chunk(etp_size, dim=dim)[etp_rank].contiguous()  # noqa: E731
    out: dict[str, torch.Tensor] = {}
    if pre_process:
        out["embedding.word_embeddings.weight"] = shard(_pad_vocab(hf["model.embed_tokens.weight"], v_pad))
    for j in range(num_local_layers):
        for suffix, names, kind in _layer_rows(layer_offset + j, m, (ep_rank, ep_size)):
            ts = [hf[n] for n in names]
            cut = eshard if kind.startswith("e_") else shard
            kind = kind.removeprefix("e_")
            if kind == "copy":
                t = ts[0]
            elif kind == "row":
                t = cut(ts[0], 1)
            elif kind == "col":
                t = shard(ts[0], 0)
            elif kind == "qkv":
                t = shard(_pack_qkv(*ts, m))  # contiguous query groups per rank
            else:  # fc1: gate and up are split separately, then stacked per rank
                gate, up = ts[0].chunk(2) if kind == "fc1_fused" else ts
                t = torch.cat([cut(gate), cut(up)])
            out[f"decoder.layers.{j}.{suffix}"] = t
    if post_process:
        out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        head = hf["lm_head.weight"] if m.untie_embeddings_and_output_weights else hf["model.embed_tokens.weight"]
        if m.untie_embeddings_and_output_weights or not pre_process:
            out["output_layer.weight"] = shard(_pad_vocab(head, v_pad))
    return out


def megatron_to_hf(local: Mapping[str, torch.Tensor], m: ModelConfig, *, gather: Callable[[torch.Tensor, int], torch.Tensor],
                   tp_size: int, layer_offset: int, num_local_layers: int, pre_process: bool, post_process: bool,
                   vocab_size: int, ep_size: int = 1, gather_expert: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
                   etp_size: int | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Full HF tensors of this pipeline stage. `gather(t, dim)` concatenates the TP shards along dim, `gather_expert` a
    routed expert's expert-TP shards (default: gather, tp_size). With ep_size > 1, `local` holds every global expert
    under `local_experts.{global index}` (read in expert_order's export order)."""
    gather_expert, etp_size = (gather, tp_size) if gather_expert is None else (gather_expert, etp_size)
    if pre_process:
        yield "model.embed_tokens.weight", gather(local["embedding.word_embeddings.weight"], 0)[:vocab_size]
    for j in range(num_local_layers):
        for suffix, names, kind in _layer_rows(layer_offset + j, m, (None if ep_size > 1 else 0, ep_size)):
            t = local[f"decoder.layers.{j}.{suffix}"]
            join, n_shards = (gather_expert, etp_size) if kind.startswith("e_") else (gather, tp_size)
            kind = kind.removeprefix("e_")
            if kind == "copy":
                yield names[0], t
            elif kind == "row":
                yield names[0], join(t, 1)
            elif kind == "col":
                yield names[0], gather(t, 0)
            elif kind == "qkv":
                yield from zip(names, _unpack_qkv(gather(t, 0), m))
            else:  # fc1: each rank holds [gate_r; up_r]
                shards = join(t, 0).chunk(n_shards)
                gate = torch.cat([s.chunk(2)[0] for s in shards])
                up = torch.cat([s.chunk(2)[1] for s in shards])
                if kind == "fc1_fused":
                    yield names[0], torch.cat([gate, up])
                else:
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
