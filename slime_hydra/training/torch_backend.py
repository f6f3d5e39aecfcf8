"""`train.backend=torch`: the HF model trained with AdamW and gradient accumulation.

One rollout of `global_batch_size × num_steps_per_rollout` samples gives `num_steps_per_rollout`
optimizer steps; each step's samples are split into micro-batches whose losses sum exactly to the
step's loss (the aggregation denominator is the whole step's). Old log-probs are recomputed with
the weights from before the rollout's first step; on that first step they *are* the current
forward pass (detached), so no extra pass is spent on them.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Iterator, Optional

import torch

from slime_hydra.algorithms import losses as L
from slime_hydra.config.schema import AlgorithmConfig, TrainConfig
from slime_hydra.training.base import TrainBatch
from slime_hydra.training.schedule import lr_multiplier


class TorchTrainBackend:
    def __init__(self, model: torch.nn.Module, algorithm: AlgorithmConfig, train: TrainConfig,
                 temperature: float, total_steps: int, device: torch.device):
        self.model = model.to(device).train()
        self.device = device
        self.algo = algorithm
        self.cfg = train
        self.temperature = temperature
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=train.lr, betas=(train.adam_beta1, train.adam_beta2),
                                           eps=train.adam_eps, weight_decay=train.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_multiplier(train.lr_decay_style, train.lr_warmup_iters, total_steps, train.lr, train.min_lr))
        self.ref_model: Optional[torch.nn.Module] = None
        self._sft_optimizer: Optional[torch.optim.Optimizer] = None

    def freeze_reference(self) -> None:
        """Snapshot the current weights as the KL reference (after any warm start)."""
        if self.algo.use_kl_loss:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)

    # -- forward -----------------------------------------------------------------------------
    def _logits(self, model: torch.nn.Module, mb: TrainBatch) -> torch.Tensor:
        ids, attn = mb.input_ids.to(self.device), mb.attention_mask.to(self.device)
        return model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # [n, T, V]

    @torch.no_grad()
    def compute_log_probs(self, batch: TrainBatch, model: Optional[torch.nn.Module] = None) -> torch.Tensor:
        """[N, T] log-probs of every target under `model` (default: the policy), by micro-batch."""
        model = model or self.model
        out = torch.zeros_like(batch.loss_mask)
        for start in range(0, batch.num_samples, self.cfg.micro_batch_size):
            mb = batch.select(torch.arange(start, min(start + self.cfg.micro_batch_size, batch.num_samples)))
            lp = L.log_probs_from_logits(self._logits(model, mb), mb.input_ids[:, 1:].to(self.device), self.temperature)
            out[start : start + mb.num_samples, : lp.shape[1]] = lp.float().cpu()
        return out

    # -- RL ----------------------------------------------------------------------------------
    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        gbs = batch.num_samples // self.cfg.num_steps_per_rollout
        old_all = self.compute_log_probs(batch) if self.cfg.num_steps_per_rollout > 1 else None
        sums: dict[str, float] = defaultdict(float)
        for step in range(self.cfg.num_steps_per_rollout):
            idx = torch.arange(step * gbs, (step + 1) * gbs)
            step_metrics = self._train_step(batch, idx, old_all)
            for k, v in step_metrics.items():
                sums[k] += v / self.cfg.num_steps_per_rollout
        return dict(sums)

    def _train_step(self, batch: TrainBatch, idx: torch.Tensor, old_all: Optional[torch.Tensor]) -> dict[str, float]:
        mode = self.algo.loss_aggregation
        denom = L.step_denominator([batch.loss_mask[idx]], mode)
        keep = idx
        if self.cfg.skip_zero_advantage_samples:
            keep = idx[(batch.advantages[idx] != 0).any(-1)]
        self._zero_grads()
        m: dict[str, float] = defaultdict(float)
        fwd_denom = max(1.0, L.step_denominator([batch.loss_mask[keep]], mode))
        for start in range(0, len(keep), self.cfg.micro_batch_size):
            mb_idx = keep[start : start + self.cfg.micro_batch_size]
            mb = batch.select(mb_idx)
            mask, adv = mb.loss_mask.to(self.device), mb.advantages.to(self.device)
            logits = self._logits(self.model, mb)
            logp = L.log_probs_from_logits(logits, mb.input_ids[:, 1:].to(self.device), self.temperature)  # [n, T]
            old = logp.detach() if old_all is None else old_all[mb_idx, : logp.shape[1]].to(self.device)
            pg_tok, clipped, ppo_kl = L.ppo_clip_loss(logp, old, adv, self.algo.eps_clip, self.algo.eps_clip_high, self.algo.eps_clip_c)
            pg_loss = L.aggregate(pg_tok, mask, mode, denom)
            loss = pg_loss
            ent = L.entropy_from_logits(logits if self.algo.entropy_coef else logits.detach(), self.temperature)
            if self.algo.entropy_coef:
                loss = loss - self.algo.entropy_coef * L.aggregate(ent, mask, mode, denom)
            if self.ref_model is not None:
                with torch.no_grad():
                    ref = L.log_probs_from_logits(self._logits(self.ref_model, mb), mb.input_ids[:, 1:].to(self.device), self.temperature)
                kl_loss = L.aggregate(L.kl_estimate(logp, ref, self.algo.kl_loss_type), mask, mode, denom)
                loss = loss + self.algo.kl_loss_coef * kl_loss
                m["train/kl_loss"] += kl_loss.item()
            loss.backward()
            m["train/loss"] += loss.item()
            m["train/pg_loss"] += pg_loss.item()
            for name, tok in (("pg_clipfrac", clipped), ("ppo_kl", ppo_kl), ("entropy", ent)):
                m[f"train/{name}"] += L.aggregate(tok.detach(), mask, mode, fwd_denom).item()
            if mb.rollout_log_probs is not None:
                diff = (old - mb.rollout_log_probs.to(self.device)).abs()
                m["train/rollout_logprob_abs_diff"] += L.aggregate(diff, mask, mode, fwd_denom).item()
        m["train/grad_norm"] = self._clip_and_step()
        m["train/lr"] = self.scheduler.get_last_lr()[0]
        m["train/kept_samples"] = float(len(keep))
        return dict(m)

    def _zero_grads(self) -> None:
        # zeros, not None: AdamW skips parameters without grads, which would make leaving
        # zero-advantage samples out of the backward pass inexact
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.zero_()

    def _clip_and_step(self) -> float:
        max_norm = self.cfg.clip_grad if self.cfg.clip_grad > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        self.optimizer.step()
        self.scheduler.step()
        return float(norm)

    # -- SFT warm start ----------------------------------------------------------------------
    def sft_step(self, batch: TrainBatch, lr: float) -> float:
        if self._sft_optimizer is None:
            self._sft_optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0)
        self._sft_optimizer.zero_grad(set_to_none=True)
        mb_all = torch.arange(batch.num_samples)
        denom = L.step_denominator([batch.loss_mask], self.algo.loss_aggregation)
        total = 0.0
        for start in range(0, batch.num_samples, self.cfg.micro_batch_size):
            mb = batch.select(mb_all[start : start + self.cfg.micro_batch_size])
            logp = L.log_probs_from_logits(self._logits(self.model, mb), mb.input_ids[:, 1:].to(self.device))
            loss = L.aggregate(L.sft_token_loss(logp), mb.loss_mask.to(self.device), self.algo.loss_aggregation, denom)
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(self.params, self.cfg.clip_grad if self.cfg.clip_grad > 0 else float("inf"))
        self._sft_optimizer.step()
        return total

    def end_warm_start(self) -> None:
        self._sft_optimizer = None
        for p in self.params:
            p.grad = None

    # -- weights and state -------------------------------------------------------------------
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, p in self.model.named_parameters():
            yield name, p.detach()

    def save_hf(self, path: str, tokenizer) -> None:
        self.model.save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)

    def load_hf_weights(self, path: str) -> None:
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=next(self.model.parameters()).dtype)
        self.model.load_state_dict(loaded.state_dict())

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.ref_model is not None:
            state["ref_model"] = self.ref_model.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if "ref_model" in state:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
            self.ref_model.load_state_dict(state["ref_model"])
