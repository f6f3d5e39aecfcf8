"""megatron's side of one model layout, which the policy's trainer (trainer.py) and PPO's critic (critic.py) share.

GPTs of the layout (from Hugging Face weights, or megatron's initialisation), megatron's DDP and optimizer around
them, micro-batches through megatron's pipeline schedule (get_forward_backward_func), vocab-parallel log-probs
(chunked: logprobs.py), and what crosses the DP and PP groups (a step's metrics, outputs of the last stage). megatron
is told to sum, not average (calculate_per_token_loss, gradients summed over DP, no division by the micro-batch count):
each micro-batch's loss is already divided by the whole step's denominator, so a step's gradient is the torch
backend's for any TP/PP/DP layout. With train.qkv_format=thd a micro-batch runs as one packed row (training/thd.py;
PackedSeqParams, megatron's unfused THD rotary, model.SDPAttention one causal call per sample) and its outputs return
to the padded layout.
Left out: context parallelism (the SDPA core attention is single-rank along the sequence).
"""

from __future__ import annotations

from collections import defaultdict
from functools import partial
from typing import Callable, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.pipeline_parallel import get_forward_backward_func

from slime_hydra.config.schema import MegatronConfig, ModelConfig, ParallelismConfig
from slime_hydra.protocols import TrainBatch
from slime_hydra.training.megatron import convert
from slime_hydra.training.megatron.logprobs import vocab_parallel_logprobs
from slime_hydra.training.megatron.model import DTYPES, build_gpt, padded_vocab_size, transformer_config
from slime_hydra.training.microbatch import micro_batch_indices
from slime_hydra.training.optim import adam_flags, megatron_clip_and_step
from slime_hydra.training.specs import BatchSpec, OptimSpec
from slime_hydra.training.thd import Packed, pack, unpack

# loss_fn(micro-batch, output of the last stage) -> (loss, 1, {name: value}), megatron's forward_step contract
LossFn = Callable[[TrainBatch, torch.Tensor], tuple]


class MegatronRunner:
    def __init__(self, model: ModelConfig, parallel: ParallelismConfig, megatron: MegatronConfig, batch: BatchSpec,
                 vocab_size: int, temperature: float, device: torch.device, sdpa: bool = True):
        """On megatron's process groups (parallel.init_parallel). model and parallel describe the GPT and its layout (read
        whole by model.py, convert.py and parallel.py); megatron (train.megatron): compile_layers, grad_reduce_in_fp32,
        log_probs_chunk_size, compile_log_probs; batch: how a step's rows become micro-batches; temperature: the
        log-probs' (rollout.rollout_temperature)."""
        self.model, self.parallel, self.megatron, self.batch = model, parallel, megatron, batch
        self.vocab_size, self.temperature, self.device, self.sdpa = vocab_size, temperature, device, sdpa
        self.config = transformer_config(model, parallel)
        self.config.finalize_model_grads_func = lambda chunks, num_tokens=None, **kw: finalize_model_grads(chunks, None, **kw)
        # train.qkv_format=thd: each micro-batch runs as one packed row (PackedSeqParams, model.SDPAttention._thd); TP
        # without sequence parallelism, PP=1, CP=1 (training/megatron/checks.py: check_batching)
        self.thd = batch.qkv_format == "thd"

    # -- models ------------------------------------------------------------------------------
    def new_gpt(self, hf_weights=None, model: Optional[ModelConfig] = None) -> torch.nn.Module:
        """A GPT of this layout (of `model`, default this runner's) on the device: this stage's shards of `hf_weights`
        (HF name -> tensor: a state dict or convert.SafetensorsDir), or megatron's initialisation when None."""
        gpt = build_gpt(model or self.model, self.config, self.vocab_size, self.sdpa).to(self.device)
        if hf_weights is not None:
            self._load(gpt, hf_weights)
        return gpt

    @property
    def layout(self) -> dict:
        """This pipeline stage's layers, as convert.py's keyword arguments."""
        n_local = self.model.num_layers // ps.get_pipeline_model_parallel_world_size()
        return dict(layer_offset=ps.get_pipeline_model_parallel_rank() * n_local, num_local_layers=n_local,
                    pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage())

    def _load(self, gpt: torch.nn.Module, hf_weights) -> None:
        tp = ps.get_tensor_model_parallel_world_size()
        shard = convert.hf_to_megatron(convert.hub_names(hf_weights), self.model, tp_rank=ps.get_tensor_model_parallel_rank(),
                                       tp_size=tp, v_pad=padded_vocab_size(self.vocab_size, tp), **self.layout,
                                       ep_rank=ps.get_expert_model_parallel_rank(), ep_size=ps.get_expert_model_parallel_world_size(),
                                       etp_rank=ps.get_expert_tensor_parallel_rank(),
                                       etp_size=ps.get_expert_tensor_parallel_world_size())
        own = gpt.state_dict()
        missing = sorted(k for k in own if k not in shard and not k.endswith("_extra_state"))
        if missing:
            raise KeyError(f"HF->Megatron conversion left {missing[:4]} unset")
        with torch.no_grad():
            for k, t in shard.items():
                own[k].copy_(t.to(own[k].dtype))

    def wrap(self, gpt: torch.nn.Module) -> DistributedDataParallel:
        """megatron's DDP around `gpt` (gradients summed over DP into its buffers), its layers compiled if asked."""
        ddp = DistributedDataParallel(self.config, DistributedDataParallelConfig(
            grad_reduce_in_fp32=self.megatron.grad_reduce_in_fp32,
            use_distributed_optimizer=self.parallel.use_distributed_optimizer), module=gpt)
        if self.megatron.compile_layers:
            for layer in gpt.decoder.layers:
                layer.compile()
        return ddp

    def optimizer(self, ddp: DistributedDataParallel, optim: OptimSpec, lr: float, weight_decay: float,
                  betas: Optional[tuple[float, float]] = None, eps: Optional[float] = None):
        """megatron's optimizer over `ddp` with `optim`'s Adam settings (betas and eps: `optim`'s unless given)."""
        dtype, c = DTYPES[self.model.dtype], optim
        b1, b2 = betas or (c.adam_beta1, c.adam_beta2)
        oc = OptimizerConfig(optimizer="adam", lr=lr, min_lr=c.min_lr, weight_decay=weight_decay, adam_beta1=b1,
                             adam_beta2=b2, adam_eps=c.adam_eps if eps is None else eps, clip_grad=c.clip_grad if c.clip_grad > 0 else 0.0,
                             bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, params_dtype=dtype,
                             use_distributed_optimizer=self.parallel.use_distributed_optimizer)
        optimizer = get_megatron_optimizer(oc, [ddp])
        for opt in getattr(optimizer, "chained_optimizers", [optimizer]):  # read by torch's AdamW at each step
            for g in opt.optimizer.param_groups:
                g.update(adam_flags(c.adam_impl))
        return optimizer

    last_step_skipped = False  # the last optimizer_step's gradient norm was not finite: no update (training/optim.py)

    def optimizer_step(self, optimizer, lr: float) -> float:
        """One step at `lr` -> the gradient norm (before clipping); a non-finite norm skips it (last_step_skipped)."""
        for g in optimizer.param_groups:
            g["lr"] = lr
        grad_norm, stepped = megatron_clip_and_step(optimizer)
        self.last_step_skipped = not stepped
        return grad_norm

    # -- micro-batches through the pipeline -------------------------------------------------------
    def micro_batches(self, batch: TrainBatch, idx: torch.Tensor, forward_only: bool = False) -> list[TrainBatch]:
        """Rows `idx` by micro_batch_size or by the token budget (padded tokens: each micro-batch runs padded to its
        longest; real tokens when packed); `mb.idx` holds each micro-batch's rows of `batch`."""
        b = self.batch
        groups = micro_batch_indices(idx, batch.attention_mask.sum(-1), b.micro_batch_size,
                                     b.log_probs_max_tokens_per_gpu if forward_only else b.max_tokens_per_gpu,
                                     padded=not self.thd)
        mbs = [batch.select(rows) for rows in groups]
        for mb, rows in zip(mbs, groups):
            mb.idx = rows
        return mbs

    def share_micro_batches(self, batch: TrainBatch, idx: torch.Tensor) -> list[TrainBatch]:
        """This DP rank's micro-batches of the rows `idx`. A rank whose share is empty while another's is not (fewer
        rows than DP ranks: skip_zero_advantage_samples with few samples kept) runs one row with its loss mask and
        advantages zeroed: it adds nothing to the loss, the gradients or the metrics, and it takes part in the step's
        collectives (the gradient reduction, the metric sums), which the other ranks would otherwise wait on until
        cluster.distributed_timeout_s. With expert parallelism every DP rank runs as many micro-batches as the one with
        the most (zeroed rows again), since each micro-batch's MoE layers are collectives of the EP group."""
        mine = self.dp_share(idx)
        if len(mine) or not len(idx):
            mbs = self.micro_batches(batch, mine)
        else:
            mbs = [self._zero_micro_batch(batch, idx)]
        if ps.get_expert_model_parallel_world_size() > 1 and len(idx):
            # each micro-batch's MoE layers exchange tokens over the EP group (all-to-all): every DP rank (an EP group is
            # made of DP ranks, and of TP ranks that share their micro-batches) runs the most micro-batches any one has
            most = torch.tensor([len(mbs)], device=self.device)
            dist.all_reduce(most, op=dist.ReduceOp.MAX, group=ps.get_data_parallel_group())
            mbs += [self._zero_micro_batch(batch, idx) for _ in range(int(most) - len(mbs))]
        return mbs

    def _zero_micro_batch(self, batch: TrainBatch, idx: torch.Tensor) -> TrainBatch:
        """One row of `idx` with its loss mask and advantages zeroed: it adds nothing to the loss, gradients or metrics."""
        (mb,) = self.micro_batches(batch, idx[:1])
        mb.loss_mask, mb.advantages = torch.zeros_like(mb.loss_mask), torch.zeros_like(mb.advantages)
        mb.zero = True  # MoE: the routers take it as padding (forward), so it adds no load-balancing loss or expert load
        return mb

    @staticmethod
    def dp_share(idx: torch.Tensor) -> torch.Tensor:
        """This DP rank's share of the rows `idx` (every rank takes the whole batch and picks its own)."""
        return idx[ps.get_data_parallel_rank() :: ps.get_data_parallel_world_size()]

    def _pad_len(self, t: int) -> int:
        tp = ps.get_tensor_model_parallel_world_size() if self.parallel.sequence_parallel else 1
        return -(-t // tp) * tp

    def run(self, model, mbs: list[TrainBatch], loss_fn: LossFn, forward_only: bool) -> list[dict]:
        """Micro-batches through megatron's schedule; returns the last stage's per-micro-batch dicts."""
        if not mbs:
            return []
        t = self._pad_len(max(mb.input_ids.shape[1] for mb in mbs)) if ps.get_pipeline_model_parallel_world_size() > 1 else None

        def step(data_iter, chunk):
            mb = next(data_iter)
            if self.thd:
                mb.packed = pack(mb.input_ids.to(self.device), mb.attention_mask.to(self.device))
            return self.forward(chunk, mb, t), partial(loss_fn, mb)

        seq_length = t or max(mb.input_ids.shape[1] for mb in mbs)
        if self.thd:  # one row per micro-batch of up to all its rows' tokens (PP=1: no fixed-shape exchange)
            seq_length = max(int(mb.attention_mask.sum()) for mb in mbs)
        return get_forward_backward_func()(
            forward_step_func=step, data_iterator=iter(mbs), model=[model], num_microbatches=len(mbs),
            seq_length=seq_length, micro_batch_size=1 if self.thd else mbs[0].num_samples,
            forward_only=forward_only) or []

    def forward(self, model, mb: TrainBatch, width: Optional[int] = None) -> torch.Tensor:
        """The output of `model` on one micro-batch: [n, width, ·], the rows padded to `width` (default: the next multiple
        sequence parallelism needs); packed, [1, S, ·] over mb.packed (run sets it)."""
        if self.thd:
            return self._forward_packed(model, mb.packed)
        ids = mb.input_ids.to(self.device)
        width = width or self._pad_len(ids.shape[1])
        if width > ids.shape[1]:
            ids = torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=0)
        pos = torch.arange(ids.shape[1], device=self.device).expand_as(ids)
        if not self.model.num_experts:
            return model(input_ids=ids, position_ids=pos, attention_mask=None)
        zero, coeff = getattr(mb, "zero", False), self.config.moe_aux_loss_coeff
        self.config.moe_aux_loss_coeff = 0.0 if zero else coeff  # read by the routers during this forward
        try:
            return model(input_ids=ids, position_ids=pos, attention_mask=None, padding_mask=self._padding_mask(mb, ids.shape[1]))
        finally:
            self.config.moe_aux_loss_coeff = coeff

    def _padding_mask(self, mb: TrainBatch, width: int) -> torch.Tensor:
        """[n, width] True on padding (megatron's MoE convention): the routers' load-balancing loss and token counts leave
        it out, so they do not depend on how far a layout pads; a zeroed micro-batch (_zero_micro_batch) is padding
        throughout. The first stage splits it over sequence parallelism itself (GPTModel.forward); a later stage gets
        its own slice."""
        real = mb.attention_mask.to(self.device).bool() & (not getattr(mb, "zero", False))
        pad = torch.nn.functional.pad(~real, (0, width - real.shape[1]), value=True)
        if self.parallel.sequence_parallel and not ps.is_pipeline_first_stage():
            tp = ps.get_tensor_model_parallel_world_size()
            pad = pad.chunk(tp, dim=1)[ps.get_tensor_model_parallel_rank()].contiguous()
        return pad

    @staticmethod
    def _forward_packed(model, p: Packed) -> torch.Tensor:
        """[1, S, ·] of a packed micro-batch: THD, position ids and rotary restarting per sample."""
        cu = p.cu_seqlens
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=p.max_seqlen,
                                 max_seqlen_kv=p.max_seqlen)
        return model(input_ids=p.input_ids, position_ids=p.position_ids, attention_mask=None, packed_seq_params=params)

    def log_probs(self, mb: TrainBatch, logits: torch.Tensor, with_entropy: bool):
        """([n, T] log-probs of the targets, [n, T] entropy or None) from a micro-batch's vocab-parallel logits."""
        mg = self.megatron
        if self.thd:  # [1, S, V] over the packed tokens -> [n, T] (0 past each row's end)
            p = mb.packed
            lp, ent = vocab_parallel_logprobs(logits, p.targets[None], self.vocab_size, self.temperature, with_entropy,
                                              mg.log_probs_chunk_size, mg.compile_log_probs)
            return unpack(lp[0], p), unpack(ent[0], p)
        T = mb.loss_mask.shape[1]
        targets = mb.input_ids[:, 1:].to(self.device)
        return vocab_parallel_logprobs(logits[:, :T], targets, self.vocab_size, self.temperature, with_entropy,
                                       mg.log_probs_chunk_size, mg.compile_log_probs)  # [n, T] x2

    @torch.no_grad()
    def per_token(self, model, batch: TrainBatch, of_output: Callable[[TrainBatch, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """[N, T] of_output(mb, output) of every micro-batch (forward only, by the log-probs' token budget), on every rank."""
        model.eval()
        mbs = self.micro_batches(batch, torch.arange(batch.num_samples), forward_only=True)

        def loss_fn(mb, out):
            return out.sum() * 0, torch.tensor(1), {"out": of_output(mb, out).float()}

        outs = self.run(model, mbs, loss_fn, forward_only=True)
        res = torch.zeros_like(batch.loss_mask)
        for mb, o in zip(mbs, outs):
            x = o["out"].cpu()
            res[mb.idx, : x.shape[1]] = x
        model.train()
        return self._broadcast_last_stage(res)

    # -- across the DP and PP groups --------------------------------------------------------------
    def _broadcast_last_stage(self, out: torch.Tensor) -> torch.Tensor:
        if ps.get_pipeline_model_parallel_world_size() > 1:
            out = out.to(self.device)
            dist.broadcast(out, ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group())
        return out.cpu()

    def step_metrics(self, outs: list[dict]) -> dict[str, float]:
        """`train/<name>` sums of the micro-batches' metrics (shares of the step's, global denominators), added over the
        DP ranks, on every stage."""
        m: dict[str, float] = defaultdict(float)
        for o in outs:
            for k, v in o.items():
                m[f"train/{k}"] += float(v)
        return self.from_last_stage(self.sum_over_dp(m))

    @staticmethod
    def sum_over_dp(m: dict[str, float]) -> dict[str, float]:
        """Metrics are sums of per-micro-batch shares of the step (global denominators): add the DP ranks' shares."""
        if ps.get_data_parallel_world_size() == 1:
            return m
        parts = [None] * ps.get_data_parallel_world_size()
        dist.all_gather_object(parts, dict(m), group=ps.get_data_parallel_group())
        out: dict[str, float] = defaultdict(float)
        for part in parts:
            for k, v in part.items():
                out[k] += v
        return out

    @staticmethod
    def from_last_stage(obj):
        """The last pipeline stage's value of `obj` on every stage (losses exist only where the logits are), so any rank
        can answer for the step."""
        if ps.get_pipeline_model_parallel_world_size() == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group())
        return box[0]
