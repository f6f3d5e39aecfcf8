"""The megatron TrainBackend: same Protocol, batch split, old log-probs and loss functions as train=torch.

One rollout gives `num_steps_per_rollout` optimizer steps; a step's kept samples are split into
micro-batches that megatron's pipeline schedule (get_forward_backward_func) runs. Each
micro-batch's loss is divided by the whole step's denominator (algorithms.losses.step_denominator),
and megatron is told to sum, not average (calculate_per_token_loss, gradients summed over DP, no
division by the micro-batch count), so a step's gradient equals the torch backend's for any
TP/PP/DP layout. The micro-batch loss is the torch backend's (training/policy_loss.py: PPO-clip /
GSPO / CISPO, TIS, KL loss, entropy, aggregation); only the log-probs differ in how they are
computed (vocab-parallel, chunked: logprobs.py). With train.qkv_format=thd a micro-batch runs as one packed row
(training/thd.py; PackedSeqParams, megatron's unfused THD rotary, model.SDPAttention one causal call per sample) and its
log-probs return to the padded layout before the same loss.
Checkpoints: `save_checkpoint` / `load_checkpoint` write and read megatron's distributed format
(checkpoint.py; any TP/PP layout); the engine's save/load go through them (TrainBackend.save_checkpoint:
`<ckpt>/megatron/` beside the HF weights; state_dict is None: nothing of the trainer in state.pt).
Given a CriticSpec (ppo) the backend owns a critic (critic.py: a second GPT of this layout with a value head, its own
optimizer, saved with the policy in `<ckpt>/megatron/`), trained on every rollout before the policy; the policy sits
out its first num_critic_only_steps rollouts.
Left out: context parallelism (the SDPA core attention is single-rank along the sequence) and
expert parallelism (convert.py).
"""

from __future__ import annotations

import json
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.pipeline_parallel import get_forward_backward_func

from slime_hydra.algorithms import losses as L
from slime_hydra.config.schema import MegatronConfig, ModelConfig, ParallelismConfig
from slime_hydra.protocols import InProcessWeights, TrainBatch
from slime_hydra.training.base import shaping_kl
from slime_hydra.training.megatron import convert
from slime_hydra.training.megatron.critic import MegatronCritic
from slime_hydra.training.megatron.logprobs import vocab_parallel_logprobs
from slime_hydra.training.megatron.model import DTYPES, build_gpt, padded_vocab_size, transformer_config
from slime_hydra.training.megatron.parallel import init_parallel
from slime_hydra.training.microbatch import micro_batch_indices
from slime_hydra.training.optim import adam_flags
from slime_hydra.training.policy_loss import old_log_probs, policy_loss
from slime_hydra.training.schedule import lr_multiplier
from slime_hydra.training.specs import BatchSpec, CriticSpec, LossSpec, OptimSpec
from slime_hydra.training.thd import Packed, pack, unpack


class MegatronTrainBackend:
    def __init__(self, hf_weights, hf_config, model: ModelConfig, parallel: ParallelismConfig, loss: LossSpec,
                 optim: OptimSpec, batch: BatchSpec, megatron: MegatronConfig, temperature: float, device: torch.device,
                 seed: int = 1234, sdpa: bool = True, distributed_timeout_s: float = 1800.0, critic: Optional[CriticSpec] = None):
        """hf_weights: HF name -> tensor (a state dict or convert.SafetensorsDir); hf_config: its transformers config.
        model and parallel describe the GPT and its layout (read whole by model.py, convert.py and parallel.py);
        megatron (train.megatron) holds this backend's own settings (compile_layers, grad_reduce_in_fp32,
        log_probs_chunk_size, compile_log_probs); optim.adam_impl picks torch's AdamW under megatron's optimizer;
        critic (ppo): the value model's spec (critic.py)."""
        problems = convert.check_convertible(model)
        if problems:
            raise ValueError(problems[0])
        init_parallel(parallel, seed, "nccl" if device.type == "cuda" else "gloo", distributed_timeout_s)
        self.mcfg, self.pcfg, self.mg = model, parallel, megatron
        self.loss, self.optim, self.batch = loss, optim, batch
        self.hf_config, self.device, self.temperature = hf_config, device, temperature
        self.vocab = hf_config.vocab_size
        self.config = transformer_config(model, parallel)
        self.sdpa = sdpa
        # train.qkv_format=thd: each micro-batch runs as one packed row (PackedSeqParams, model.SDPAttention._thd); TP
        # without sequence parallelism, PP=1, CP=1 (config/validate_microbatch.py)
        self.thd = batch.qkv_format == "thd"
        gpt = self._new_gpt()
        if hf_weights is not None:  # None: keep megatron's random initialisation (benchmarks)
            self._load(gpt, hf_weights)
        self.gpt = gpt
        self.config.finalize_model_grads_func = lambda chunks, num_tokens=None, **kw: finalize_model_grads(chunks, None, **kw)
        self.ddp = self._wrap(gpt)
        self.optimizer = self._optimizer(optim.lr, optim.weight_decay)
        self.lr_at = lr_multiplier(optim.lr_decay_style, optim.lr_warmup_iters, optim.total_steps, optim.lr, optim.min_lr)
        self.steps_done = 0
        self.ref: Optional[torch.nn.Module] = None
        self._sft_optimizer = None
        # ppo: the critic, a second GPT of this layout (critic.py), trained on every rollout; the policy sits out the
        # first num_critic_only_steps rollouts
        self.critic = MegatronCritic(self, critic, loss) if critic is not None else None
        self.critic_only_steps = critic.num_critic_only_steps if critic is not None else 0
        self.rollouts_trained = 0

    # -- construction ------------------------------------------------------------------------
    def _new_gpt(self) -> torch.nn.Module:
        gpt = build_gpt(self.mcfg, self.config, self.vocab, self.sdpa)
        return gpt.to(self.device)

    @property
    def _layout(self) -> dict:
        n_local = self.mcfg.num_layers // ps.get_pipeline_model_parallel_world_size()
        return dict(layer_offset=ps.get_pipeline_model_parallel_rank() * n_local, num_local_layers=n_local,
                    pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage())

    def _load(self, gpt: torch.nn.Module, hf_weights) -> None:
        tp = ps.get_tensor_model_parallel_world_size()
        shard = convert.hf_to_megatron(convert.hub_names(hf_weights), self.mcfg, tp_rank=ps.get_tensor_model_parallel_rank(), tp_size=tp,
                                       v_pad=padded_vocab_size(self.vocab, tp), **self._layout)
        own = gpt.state_dict()
        missing = sorted(k for k in own if k not in shard and not k.endswith("_extra_state"))
        if missing:
            raise KeyError(f"HF->Megatron conversion left {missing[:4]} unset")
        with torch.no_grad():
            for k, t in shard.items():
                own[k].copy_(t.to(own[k].dtype))

    def _wrap(self, gpt: torch.nn.Module) -> DistributedDataParallel:
        """megatron's DDP around `gpt` (gradients summed over DP into its buffers), its layers compiled if asked."""
        ddp = DistributedDataParallel(self.config, DistributedDataParallelConfig(
            grad_reduce_in_fp32=self.mg.grad_reduce_in_fp32, use_distributed_optimizer=self.pcfg.use_distributed_optimizer),
            module=gpt)
        if self.mg.compile_layers:
            for layer in gpt.decoder.layers:
                layer.compile()
        return ddp

    def _optimizer(self, lr: float, weight_decay: float, betas: Optional[tuple[float, float]] = None, eps: Optional[float] = None,
                   optim: Optional[OptimSpec] = None, ddp: Optional[DistributedDataParallel] = None):
        """megatron's optimizer over `ddp` (default: the policy's) with `optim`'s Adam settings (default: the policy's)."""
        dtype = DTYPES[self.mcfg.dtype]
        c = optim or self.optim
        b1, b2 = betas or (c.adam_beta1, c.adam_beta2)
        oc = OptimizerConfig(optimizer="adam", lr=lr, min_lr=c.min_lr, weight_decay=weight_decay, adam_beta1=b1,
                             adam_beta2=b2, adam_eps=c.adam_eps if eps is None else eps, clip_grad=c.clip_grad if c.clip_grad > 0 else 0.0,
                             bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, params_dtype=dtype,
                             use_distributed_optimizer=self.pcfg.use_distributed_optimizer)
        optimizer = get_megatron_optimizer(oc, [ddp or self.ddp])
        for opt in getattr(optimizer, "chained_optimizers", [optimizer]):  # read by torch's AdamW at each step
            for g in opt.optimizer.param_groups:
                g.update(adam_flags(c.adam_impl))
        return optimizer

    def freeze_reference(self) -> None:
        """After any warm start: snapshot the KL reference, and start the critic from the policy's body."""
        if self.loss.keep_reference:
            self.ref = self._new_gpt().eval().requires_grad_(False)
            self.ref.load_state_dict(self.gpt.state_dict())
        if self.critic is not None:
            self.critic.reset_from(self.gpt)

    # -- forward -----------------------------------------------------------------------------
    def _pad_len(self, t: int) -> int:
        tp = ps.get_tensor_model_parallel_world_size() if self.pcfg.sequence_parallel else 1
        return -(-t // tp) * tp

    def _run(self, model, mbs: list[TrainBatch], loss_fn, forward_only: bool) -> list[dict]:
        """Micro-batches through megatron's schedule; returns the last stage's per-micro-batch dicts."""
        if not mbs:
            return []
        t = self._pad_len(max(mb.input_ids.shape[1] for mb in mbs)) if ps.get_pipeline_model_parallel_world_size() > 1 else None

        def step(data_iter, chunk):
            mb = next(data_iter)
            if self.thd:
                mb.packed = pack(mb.input_ids.to(self.device), mb.attention_mask.to(self.device))
                return self._forward_packed(chunk, mb.packed), partial(loss_fn, mb)
            ids = mb.input_ids.to(self.device)
            width = t or self._pad_len(ids.shape[1])
            if width > ids.shape[1]:
                ids = torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=0)
            pos = torch.arange(ids.shape[1], device=self.device).expand_as(ids)
            out = chunk(input_ids=ids, position_ids=pos, attention_mask=None)
            return out, partial(loss_fn, mb)

        seq_length = t or max(mb.input_ids.shape[1] for mb in mbs)
        if self.thd:  # one row per micro-batch of up to all its rows' tokens (PP=1: no fixed-shape exchange)
            seq_length = max(int(mb.attention_mask.sum()) for mb in mbs)
        return get_forward_backward_func()(
            forward_step_func=step, data_iterator=iter(mbs), model=[model], num_microbatches=len(mbs),
            seq_length=seq_length, micro_batch_size=1 if self.thd else mbs[0].num_samples,
            forward_only=forward_only) or []

    def _forward_packed(self, model, p: Packed) -> torch.Tensor:
        """[1, S, V_pad/tp] logits of a packed micro-batch: THD, position ids and rotary restarting per sample."""
        cu = p.cu_seqlens
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=p.max_seqlen,
                                 max_seqlen_kv=p.max_seqlen)
        return model(input_ids=p.input_ids, position_ids=p.position_ids, attention_mask=None, packed_seq_params=params)

    def _logp(self, mb: TrainBatch, logits: torch.Tensor, with_entropy: bool):
        if self.thd:  # [1, S, V] over the packed tokens -> [n, T] (0 past each row's end)
            p = mb.packed
            lp, ent = vocab_parallel_logprobs(logits, p.targets[None], self.vocab, self.temperature, with_entropy,
                                              self.mg.log_probs_chunk_size, self.mg.compile_log_probs)
            return unpack(lp[0], p), unpack(ent[0], p)
        T = mb.loss_mask.shape[1]
        targets = mb.input_ids[:, 1:].to(self.device)
        mg = self.mg
        return vocab_parallel_logprobs(logits[:, :T], targets, self.vocab, self.temperature, with_entropy,
                                       mg.log_probs_chunk_size, mg.compile_log_probs)  # [n, T] x2

    def _micro_batches(self, batch: TrainBatch, idx: torch.Tensor, forward_only: bool = False) -> list[TrainBatch]:
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

    def _broadcast_last_stage(self, out: torch.Tensor) -> torch.Tensor:
        if ps.get_pipeline_model_parallel_world_size() > 1:
            out = out.to(self.device)
            dist.broadcast(out, ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group())
        return out.cpu()

    @torch.no_grad()
    def compute_log_probs(self, batch: TrainBatch, model=None, temperature: Optional[float] = None) -> torch.Tensor:
        """[N, T] log-probs of every target under `model` (default: the policy), by micro-batch."""
        model = model or self.ddp
        model.eval()
        mbs = self._micro_batches(batch, torch.arange(batch.num_samples), forward_only=True)

        def loss_fn(mb, logits):
            lp, _ = self._logp(mb, logits, with_entropy=False)
            return logits.sum() * 0, torch.tensor(1), {"logp": lp.float()}

        outs = self._run(model, mbs, loss_fn, forward_only=True)
        res = torch.zeros_like(batch.loss_mask)
        for mb, o in zip(mbs, outs):
            lp = o["logp"].cpu()
            res[mb.idx, : lp.shape[1]] = lp
        model.train()
        return self._broadcast_last_stage(res)

    @torch.no_grad()
    def reward_kl(self, batch: TrainBatch) -> torch.Tensor:
        return shaping_kl(batch, self.loss, self.compute_log_probs, self.ref)

    # -- RL ----------------------------------------------------------------------------------
    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        metrics = self.critic.train_rollout(batch) if self.critic is not None else {}
        if self.rollouts_trained >= self.critic_only_steps:
            metrics |= self._train_policy(batch)
        self.rollouts_trained += 1
        interval = self.loss.ref_update_interval
        if interval and self.ref is not None and self.rollouts_trained % interval == 0:
            self.ref.load_state_dict(self.gpt.state_dict())  # slime's --ref-update-interval, as the torch backend
        return metrics

    def _train_policy(self, batch: TrainBatch) -> dict[str, float]:
        steps = self.batch.num_steps_per_rollout
        gbs = batch.num_samples // steps
        old_later = None
        if steps > 1 and not self.loss.use_rollout_logprobs:
            later = self.compute_log_probs(batch.select(torch.arange(gbs, batch.num_samples)))
            old_later = torch.zeros_like(batch.loss_mask)
            old_later[gbs:, : later.shape[1]] = later
        sums: dict[str, float] = defaultdict(float)
        for step in range(steps):
            idx = torch.arange(step * gbs, (step + 1) * gbs)
            for k, v in self._train_step(batch, idx, old_later if step > 0 else None).items():
                sums[k] += v / steps
        return dict(sums)

    def _train_step(self, batch: TrainBatch, idx: torch.Tensor, old_all: Optional[torch.Tensor]) -> dict[str, float]:
        mode = self.loss.loss_aggregation
        denom = L.step_denominator([batch.loss_mask[idx]], mode, self.loss.max_response_len)
        keep = idx[(batch.advantages[idx] != 0).any(-1)] if self.batch.skip_zero_advantage_samples else idx
        metric_mode = L.metric_aggregation(mode)
        metric_denom = max(1.0, L.step_denominator([batch.loss_mask[keep]], metric_mode))
        mine = keep[ps.get_data_parallel_rank() :: ps.get_data_parallel_world_size()]  # this DP rank's share
        mbs = self._micro_batches(batch, mine)  # mb.idx: the rows of old_all each micro-batch reads
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        outs = self._run(self.ddp, mbs, partial(self._loss, old_all=old_all, denom=denom, metric_mode=metric_mode,
                                               metric_denom=metric_denom), forward_only=False)
        m: dict[str, float] = defaultdict(float)
        for o in outs:
            for k, v in o.items():
                m[f"train/{k}"] += float(v)
        m = self._from_last_stage(self._sum_over_dp(m))
        m["train/grad_norm"] = self._optimizer_step(self.optimizer, self.lr_at(self.steps_done) * self.optim.lr)
        self.steps_done += 1
        m["train/lr"] = self.lr_at(self.steps_done) * self.optim.lr
        m["train/kept_samples"] = float(len(keep))
        return dict(m)

    def _sum_over_dp(self, m: dict[str, float]) -> dict[str, float]:
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

    def _from_last_stage(self, obj):
        """The last pipeline stage's value of `obj` on every stage (losses exist only where the logits are), so any rank
        can answer for the step."""
        if ps.get_pipeline_model_parallel_world_size() == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group())
        return box[0]

    def _optimizer_step(self, optimizer, lr: float) -> float:
        for g in optimizer.param_groups:
            g["lr"] = lr
        _, grad_norm, _ = optimizer.step()
        return float(grad_norm or 0.0)

    def _loss(self, mb: TrainBatch, logits: torch.Tensor, old_all, denom: float, metric_mode: str, metric_denom: float):
        """One micro-batch on the last stage: (loss, 1, metrics), the torch backend's policy_loss on vocab-parallel log-probs."""
        spec = self.loss
        mask, adv = mb.loss_mask.to(self.device), mb.advantages.to(self.device)
        logp, ent = self._logp(mb, logits, with_entropy=bool(spec.entropy_coef))  # [n, T]
        rollout_lp = mb.rollout_log_probs.to(self.device) if mb.rollout_log_probs is not None else None
        old = old_log_probs(spec, logp, rollout_lp, None if old_all is None else old_all[mb.idx])
        loss, scalars, per_token = policy_loss(spec, logp, ent, old, adv, mask, rollout_lp, lambda: self._ref_logp(mb), denom)
        metrics = {k: v.detach() for k, v in scalars.items()}
        metrics |= {k: L.aggregate(t.detach(), mask, metric_mode, metric_denom) for k, t in per_token.items()}
        return loss, torch.tensor(1, device=self.device), metrics

    def _ref_logp(self, mb: TrainBatch) -> torch.Tensor:
        """Reference log-probs of one micro-batch (the reference runs whole on this stage only when PP=1)."""
        if ps.get_pipeline_model_parallel_world_size() > 1:
            raise NotImplementedError("algorithm.use_kl_loss with pipeline_model_parallel_size>1 is not supported yet")
        with torch.no_grad():
            if self.thd:
                return self._logp(mb, self._forward_packed(self.ref, mb.packed), False)[0]
            ids = mb.input_ids.to(self.device)
            w = self._pad_len(ids.shape[1])
            ids = torch.nn.functional.pad(ids, (0, w - ids.shape[1]))
            pos = torch.arange(w, device=self.device).expand_as(ids)
            return self._logp(mb, self.ref(input_ids=ids, position_ids=pos, attention_mask=None), False)[0]

    # -- SFT warm start ----------------------------------------------------------------------
    def sft_step(self, batch: TrainBatch, lr: float) -> float:
        if self._sft_optimizer is None:
            self._sft_optimizer = self._optimizer(lr, 0.0, betas=(0.9, 0.999), eps=1e-8)  # torch backend's SFT AdamW defaults
        mode = L.metric_aggregation(self.loss.loss_aggregation)
        denom = L.step_denominator([batch.loss_mask], mode)

        def loss_fn(mb, logits):
            lp, _ = self._logp(mb, logits, with_entropy=False)
            loss = L.aggregate(L.sft_token_loss(lp), mb.loss_mask.to(self.device), mode, denom)
            return loss, torch.tensor(1, device=self.device), {"loss": loss.detach()}

        # this DP rank's share of the rows, as in _train_step: the gradients are summed over DP, so a rank that took every
        # row made the step's gradient DP times the one-process one (grad norm 13.81 vs 6.90 at DP=2, before clipping)
        mine = torch.arange(batch.num_samples)[ps.get_data_parallel_rank() :: ps.get_data_parallel_world_size()]
        self.ddp.zero_grad_buffer()
        self._sft_optimizer.zero_grad()
        outs = self._run(self.ddp, self._micro_batches(batch, mine), loss_fn, forward_only=False)
        self._optimizer_step(self._sft_optimizer, lr)
        loss = self._sum_over_dp({"loss": sum(float(o["loss"]) for o in outs)})  # shares of the whole batch's denominator
        return self._from_last_stage(loss["loss"])

    def end_warm_start(self) -> None:
        """The warm start's optimizer moved the weights; the RL optimizer's fp32 main params (bf16 / fp16 models) are
        copies taken when it was built and would overwrite them at its first step: they are copied again."""
        self._sft_optimizer = None
        self.ddp.zero_grad_buffer()
        self.optimizer.reload_model_params()

    # -- weights and state -------------------------------------------------------------------
    def _gather(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        tp = ps.get_tensor_model_parallel_world_size()
        if tp == 1:
            return t
        parts = [torch.empty_like(t) for _ in range(tp)]
        dist.all_gather(parts, t.contiguous(), group=ps.get_tensor_model_parallel_group())
        return torch.cat(parts, dim=dim)

    def named_weights(self) -> InProcessWeights:
        """HF names and full (TP-gathered: iterating is a collective of the TP group) tensors of this stage's weights."""
        return InProcessWeights(self._hf_weights)

    def _hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        local = {k: v.detach() for k, v in self.gpt.state_dict().items() if not k.endswith("_extra_state")}
        yield from convert.megatron_to_hf(local, self.mcfg, gather=self._gather, tp_size=ps.get_tensor_model_parallel_world_size(),
                                          vocab_size=self.vocab, **self._layout)

    def named_weights_all_stages(self) -> list[tuple[str, torch.Tensor]]:
        """Collective: HF names and full CPU tensors of the whole model (every pipeline stage's, TP-gathered) on the first
        stage's ranks; the other stages get []. What a rollout engine loads when PP > 1."""
        mine = [(k, v.cpu()) for k, v in self.named_weights()]  # every TP rank joins the gather
        pp = ps.get_pipeline_model_parallel_world_size()
        if pp == 1:
            return mine
        parts = [None] * pp if ps.is_pipeline_first_stage() else None
        dist.gather_object(mine, parts, dst=ps.get_pipeline_model_parallel_first_rank(),
                           group=ps.get_pipeline_model_parallel_group())
        return [kv for part in parts for kv in part] if parts is not None else []

    def save_hf(self, path: str, tokenizer=None) -> None:
        """config.json + safetensors (one file per pipeline stage, with an index when PP>1) + tokenizer."""
        from safetensors.torch import save_file

        weights = {k: v.cpu().contiguous() for k, v in self.named_weights()}  # every TP rank joins the gather
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

    def values(self, batch: TrainBatch) -> torch.Tensor:
        """Collective: [N, T] the critic's values on the loss mask, on every rank."""
        if self.critic is None:
            raise RuntimeError("values() needs the critic (a CriticSpec: algorithm.advantage_estimator=ppo)")
        return self.critic.values(batch)

    def state_dict(self) -> None:
        """None: the whole resume state is save_checkpoint's `<ckpt>/megatron/` (nothing of the trainer in state.pt)."""
        return None

    def load_state_dict(self, state: Optional[dict]) -> None:
        """Nothing: load_checkpoint reads it all."""

    def save_checkpoint(self, path: str) -> None:
        """Collective: model, optimizer, KL reference and ppo's critic (model, optimizer) into `<path>/megatron`
        (dist_checkpointing, atomic); the step and rollout counters in its common part."""
        from slime_hydra.training.megatron import checkpoint

        c = self.critic
        checkpoint.save(path, self.gpt, self.optimizer, self.ref, self._counters(),
                        critic=None if c is None else (c.gpt, c.optimizer))

    def _counters(self) -> dict:
        out = {"steps_done": self.steps_done, "rollouts_trained": self.rollouts_trained}
        return out | ({"critic_steps_done": self.critic.steps_done} if self.critic is not None else {})

    def load_checkpoint(self, path: str) -> None:
        """Collective: the inverse of save_checkpoint, into this run's layout (TP/PP may differ from the writer's, and with the
        distributed optimizer the DP size; the optimizer kind must be the writer's: checkpoint.check_loadable)."""
        from slime_hydra.training.megatron import checkpoint

        if self.ref is None and self.loss.keep_reference:
            self.ref = self._new_gpt().eval().requires_grad_(False)
        c = self.critic
        extra = checkpoint.load(path, self.gpt, self.optimizer, self.ref, critic=None if c is None else (c.gpt, c.optimizer))
        self.steps_done = extra["steps_done"]
        self.rollouts_trained = extra.get("rollouts_trained", 0)
        if c is not None:
            c.steps_done = extra["critic_steps_done"]
