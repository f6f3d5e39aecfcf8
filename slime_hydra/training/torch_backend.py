"""`train.backend=torch`: the HF model trained with AdamW and gradient accumulation.

One rollout of `global_batch_size × num_steps_per_rollout` samples gives `num_steps_per_rollout`
optimizer steps (training/rollout_schedule.py: the steps, their old log-probs, the critic-only rollouts of ppo and
the reference refresh of ref_update_interval, as under train=megatron); each step's samples are split into
micro-batches whose losses sum exactly to the step's loss (the aggregation denominator is the whole step's).
The loss is the LossSpec's (its surrogate a callable: PPO-clip, GSPO, CISPO or algorithm.custom_loss).
Given a CriticSpec (ppo) the backend owns a critic (training/critic.py). Data-parallel ranks (Ray) differ only in
their collectives (training/collectives.py): the step's denominators and gradients are summed over the ranks.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Optional

import torch

from slime_hydra.algorithms import losses as L
from slime_hydra.errors import ConfigError
from slime_hydra.protocols import InProcessWeights, TrainBatch
from slime_hydra.training.base import shaping_kl
from slime_hydra.training.collectives import ONE_PROCESS, Collectives
from slime_hydra.training.critic import TorchCritic, no_critic_in
from slime_hydra.training.gpu_memory import device_used, release_figures, step_figures
from slime_hydra.training.microbatch import micro_batch_indices
from slime_hydra.training.offload import HostOffload, module_tensors, optimizer_tensors
from slime_hydra.training.optim import SKIPPED_STEPS, adamw, clip_and_step
from slime_hydra.training.packed import packed_logits
from slime_hydra.training.policy_loss import old_log_probs
from slime_hydra.training.prefix import shared_prefix_logits
from slime_hydra.training.rollout_schedule import RolloutSchedule
from slime_hydra.training.schedule import lr_multiplier
from slime_hydra.training.specs import BatchSpec, CriticSpec, LossSpec, OptimSpec
from slime_hydra.training.thd import pack, thd_logits, unpack


class TorchTrainBackend:
    def __init__(self, model: torch.nn.Module, loss: LossSpec, optim: OptimSpec, batch: BatchSpec, temperature: float,
                 device: torch.device, critic: Optional[CriticSpec] = None, model_impl: str = "transformers",
                 collectives: Collectives = ONE_PROCESS):
        """collectives: what a step reduces over data-parallel ranks (training/distributed.DataParallel; one process:
        nothing), the critic's steps too."""
        self.model = model.to(device).train()
        self.device, self.collectives = device, collectives
        self.loss, self.optim, self.batch = loss, optim, batch
        self.temperature = temperature
        self.model_impl = model_impl  # transformers | native (training/packed.py)
        # train.qkv_format=thd (training/thd.py); the native forward packs whatever the format
        self.packs = model_impl == "native" or batch.qkv_format == "thd"
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = adamw(self.params, optim.adam_impl, lr=optim.lr, betas=(optim.adam_beta1, optim.adam_beta2),
                               eps=optim.adam_eps, weight_decay=optim.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_multiplier(optim.lr_decay_style, optim.lr_warmup_iters, optim.total_steps, optim.lr, optim.min_lr))
        self.ref_model: Optional[torch.nn.Module] = None
        self._sft_optimizer: Optional[torch.optim.Optimizer] = None
        self.critic = TorchCritic(self.model, critic, batch, loss, device, collectives) if critic is not None else None
        self.schedule = RolloutSchedule.of(loss, batch, critic)
        self.offload = HostOffload()  # cluster.offload_train: release_memory / resume_memory

    def freeze_reference(self) -> None:
        """After any warm start: snapshot the KL reference, and start the critic from the policy's body."""
        if self.loss.keep_reference:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        if self.critic is not None:
            self.critic.reset_from(self.model)

    def values(self, batch: TrainBatch) -> torch.Tensor:
        if self.critic is None:
            raise RuntimeError("values() needs the critic (a CriticSpec: algorithm.advantage_estimator=ppo)")
        return self.critic.values(batch)

    # -- forward -----------------------------------------------------------------------------
    def _micro_batches(self, batch: TrainBatch, idx: torch.Tensor, forward_only: bool = False) -> list[torch.Tensor]:
        """Rows `idx` of `batch` split into micro-batches (index tensors): by micro_batch_size, or by the token
        budget, costed as padded tokens unless the forward packs them (thd, or the native forward)."""
        b = self.batch
        return micro_batch_indices(idx, batch.attention_mask.sum(-1), b.micro_batch_size,
                                   b.log_probs_max_tokens_per_gpu if forward_only else b.max_tokens_per_gpu,
                                   padded=not self.packs)

    def _log_probs(self, model: torch.nn.Module, mb: TrainBatch, entropy: str = "", temperature: Optional[float] = None):
        """([n, T] log-probs of the targets, [n, T] entropy or None); entropy: "" (none) | detached | grad.

        train.qkv_format=thd under transformers: the micro-batch runs as one packed row (training/thd.py), the
        log-probs and entropy are taken per packed token and put back in the padded layout (0 past a row's end)."""
        temperature = self.temperature if temperature is None else temperature
        if self.batch.qkv_format == "thd" and self.model_impl != "native":
            p = pack(mb.input_ids.to(self.device), mb.attention_mask.to(self.device))
            logits = thd_logits(model, p)  # [S, V]
            targets, back = p.targets, lambda x: unpack(x, p)
        else:
            logits = self._logits(model, mb)  # [n, T, V]
            targets, back = mb.input_ids[:, 1:].to(self.device), lambda x: x
        logp = back(L.log_probs_from_logits(logits, targets, temperature))
        if not entropy:
            return logp, None
        return logp, back(L.entropy_from_logits(logits if entropy == "grad" else logits.detach(), temperature))

    def _logits(self, model: torch.nn.Module, mb: TrainBatch) -> torch.Tensor:
        """[n, T, V]; exact on the loss mask (train.prefix_sharing runs each distinct prompt once)."""
        ids, attn = mb.input_ids.to(self.device), mb.attention_mask.to(self.device)
        if self.model_impl == "native":
            return packed_logits(model, ids, attn, mb.loss_mask.to(self.device), share_prefix=self.batch.prefix_sharing)
        if self.batch.prefix_sharing:
            return shared_prefix_logits(model, ids, attn, mb.loss_mask.to(self.device))
        return model(input_ids=ids, attention_mask=attn).logits[:, :-1]

    @torch.no_grad()
    def compute_log_probs(self, batch: TrainBatch, model: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """[N, T] log-probs of every target under `model` (default: the policy), by micro-batch."""
        model = model or self.model
        out = torch.zeros_like(batch.loss_mask)
        for rows in self._micro_batches(batch, torch.arange(batch.num_samples), forward_only=True):
            lp, _ = self._log_probs(model, batch.select(rows))
            out[rows, : lp.shape[1]] = lp.float().cpu()
        return out

    @torch.no_grad()
    def reward_kl(self, batch: TrainBatch) -> torch.Tensor:
        return shaping_kl(batch, self.loss, self.compute_log_probs, self.ref_model)

    # -- RL ----------------------------------------------------------------------------------
    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        critic = None if self.critic is None else self.critic.train_rollout
        metrics = self.schedule.train(batch, self._train_step, self.compute_log_probs, critic, self.ref_model, self.model)
        return metrics | step_figures(self.device)

    def _train_step(self, batch: TrainBatch, idx: torch.Tensor, old_all: Optional[torch.Tensor]) -> dict[str, float]:
        mode = self.loss.loss_aggregation
        denom = self._step_denominator([batch.loss_mask[idx]], mode)
        keep = idx
        if self.batch.skip_zero_advantage_samples:
            keep = idx[(batch.advantages[idx] != 0).any(-1)]
        # a rank whose share keeps no rows (skip_zero_advantage_samples, few kept) runs no micro-batch but still joins
        # both sums and the gradient all-reduce with zeros: the other ranks are not left waiting in them
        self._zero_grads()
        m: dict[str, float] = defaultdict(float)
        metric_mode = L.metric_aggregation(mode)
        metric_denom = max(1.0, self._step_denominator([batch.loss_mask[keep]], metric_mode))
        for mb_idx in self._micro_batches(batch, keep):
            loss, scalars, per_token, mask = self._micro_batch_loss(batch.select(mb_idx), mb_idx, old_all, denom)
            loss.backward()
            for name, value in scalars.items():
                m[f"train/{name}"] += value.item()
            for name, tok in per_token.items():
                m[f"train/{name}"] += L.aggregate(tok.detach(), mask, metric_mode, metric_denom).item()
        m["train/grad_norm"], stepped = self._clip_and_step()
        m[SKIPPED_STEPS] = float(not stepped)
        m["train/lr"] = self.scheduler.get_last_lr()[0]
        m["train/kept_samples"] = float(len(keep))
        return dict(m)

    def _step_denominator(self, masks: list[torch.Tensor], mode: str) -> float:
        """A step's aggregation denominator, summed over the data-parallel ranks."""
        return self.collectives.sum(L.step_denominator(masks, mode, self.loss.max_response_len))

    def _micro_batch_loss(self, mb: TrainBatch, mb_idx: torch.Tensor, old_all: Optional[torch.Tensor], denom: float):
        """One micro-batch: (loss, scalar terms, per-token metrics, mask). Scalars sum exactly over micro-batches."""
        spec = self.loss
        mask, adv = mb.loss_mask.to(self.device), mb.advantages.to(self.device)
        logp, ent = self._log_probs(self.model, mb, "grad" if spec.entropy_coef else "detached")  # [n, T] x2
        rollout_lp = mb.rollout_log_probs.to(self.device) if mb.rollout_log_probs is not None else None
        old = old_log_probs(spec, logp, rollout_lp, None if old_all is None else old_all[mb_idx])  # [n, T]

        def ref_logp():
            with torch.no_grad():
                return self._log_probs(self.ref_model, mb)[0]

        loss, scalars, per_token = spec.objective(spec, logp, ent, old, adv, mask, rollout_lp, ref_logp, denom)
        return loss, scalars, per_token, mask

    def _zero_grads(self) -> None:
        # zeros, not None: AdamW skips parameters without grads, which would make leaving
        # zero-advantage samples out of the backward pass inexact
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()

    def _clip_and_step(self) -> tuple[float, bool]:
        """(gradient norm, whether the optimizer stepped: not when the norm is NaN or inf; training/optim.py)."""
        self.collectives.reduce_gradients(self.params)
        norm, stepped = clip_and_step(self.params, self.optimizer, self.optim.clip_grad)
        self.scheduler.step()
        return norm, stepped

    # -- SFT warm start ----------------------------------------------------------------------
    def sft_step(self, batch: TrainBatch, lr: float) -> float:
        if self._sft_optimizer is None:
            self._sft_optimizer = adamw(self.params, self.optim.adam_impl, lr=lr)
        self._sft_optimizer.zero_grad(set_to_none=True)
        mode = L.metric_aggregation(self.loss.loss_aggregation)  # token-sum modes are for the RL loss, not SFT
        denom = L.step_denominator([batch.loss_mask], mode)
        total = 0.0
        for rows in self._micro_batches(batch, torch.arange(batch.num_samples)):
            mb = batch.select(rows)
            logp, _ = self._log_probs(self.model, mb, temperature=1.0)
            loss = L.aggregate(L.sft_token_loss(logp), mb.loss_mask.to(self.device), mode, denom)
            loss.backward()
            total += loss.item()
        clip_and_step(self.params, self._sft_optimizer, self.optim.clip_grad)
        return total

    def end_warm_start(self) -> None:
        self._sft_optimizer = None
        for p in self.params:
            p.grad = None

    # -- weights and state -------------------------------------------------------------------
    def named_weights(self) -> InProcessWeights:
        return InProcessWeights(lambda: ((name, p.detach()) for name, p in self.model.named_parameters()))

    def save_hf(self, path: str, tokenizer) -> None:
        self.model.save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)

    def load_hf_weights(self, path: str) -> None:
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=next(self.model.parameters()).dtype)
        self.model.load_state_dict(loaded.state_dict())

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "rollouts_trained": self.schedule.rollouts_trained}
        if self.ref_model is not None:
            state["ref_model"] = self.ref_model.state_dict()
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def save_checkpoint(self, path: str) -> None:
        """Nothing beside the HF weights: the optimizer, scheduler, reference and critic travel in state_dict."""

    def load_checkpoint(self, path: str) -> None:
        """Nothing to read: see save_checkpoint."""

    # -- cluster.offload_train ---------------------------------------------------------------------
    def release_memory(self) -> dict[str, float]:
        held = [self.model, self.ref_model, self.critic.model if self.critic is not None else None]
        optimizers = [self.optimizer, self._sft_optimizer, self.critic.optimizer if self.critic is not None else None]
        tensors = [t for m in held if m is not None for t in module_tensors(m)]
        tensors += [t for o in optimizers if o is not None for t in optimizer_tensors(o)]
        used = device_used(self.device)
        return release_figures(self.device, used, self.offload.release(tensors))

    def resume_memory(self) -> None:
        self.offload.resume()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.schedule.rollouts_trained = state.get("rollouts_trained", 0)
        if self.critic is not None:
            if "critic" not in state:
                raise ConfigError([no_critic_in("the checkpoint loaded (load=)")])
            self.critic.load_state_dict(state["critic"])
        if "ref_model" in state:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
            self.ref_model.load_state_dict(state["ref_model"])
