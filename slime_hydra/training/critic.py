"""PPO's value model for `train.backend=torch`: the policy's transformer body plus a scalar head.

As slime's critic, it starts from the policy's weights (after any warm start) with a fresh value
head (zero-initialised, so the first values are 0), has its own AdamW (`train.critic_lr`, the
policy's lr schedule shape) and trains on the clipped value loss (`algorithm.value_clip`) of the
returns GAE gives, aggregated like the policy loss (`algorithm.loss_aggregation`).
Layout: values[:, t] = V(tokens[: t + 1]), the value of the state that predicts token t + 1, so it
lines up with the loss mask and the advantages ([N, T], see training/batch.py).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Optional

import torch
from torch import nn

from slime_hydra.algorithms import losses as L
from slime_hydra.algorithms.critic import value_loss
from slime_hydra.config.schema import AlgorithmConfig, TrainConfig
from slime_hydra.protocols import TrainBatch
from slime_hydra.training.optim import adamw
from slime_hydra.training.schedule import lr_multiplier


class ValueModel(nn.Module):
    def __init__(self, policy: nn.Module):
        super().__init__()
        self.body = copy.deepcopy(getattr(policy, policy.base_model_prefix))  # the decoder without its LM head
        hidden = policy.config.hidden_size
        p = next(self.body.parameters())
        self.value_head = nn.Linear(hidden, 1, bias=True, device=p.device, dtype=p.dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [n, T+1, H]
        return self.value_head(hidden).squeeze(-1)[:, :-1]  # [n, T]


class TorchCritic:
    def __init__(self, policy: nn.Module, algorithm: AlgorithmConfig, train: TrainConfig, total_steps: int,
                 device: torch.device, max_response_len: Optional[int] = None):
        self.algo, self.cfg, self.device = algorithm, train, device
        self.max_response_len = max_response_len
        self.model = ValueModel(policy).to(device).train()
        lr = train.critic_lr if train.critic_lr is not None else train.lr
        self.optimizer = adamw(self.model.parameters(), train.adam_impl, lr=lr, betas=(train.adam_beta1, train.adam_beta2),
                               eps=train.adam_eps, weight_decay=train.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_multiplier(train.lr_decay_style, train.lr_warmup_iters, total_steps, lr,
                                          train.min_lr * lr / train.lr if train.lr > 0 else 0.0))

    def reset_from(self, policy: nn.Module) -> None:
        """Re-copy the body from the policy (after the warm start changed it), keeping the zero head."""
        self.model.body.load_state_dict(getattr(policy, policy.base_model_prefix).state_dict())

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> torch.Tensor:
        """[N, T] values of the rollout's states (the old values of the value loss), zero off the mask."""
        out = torch.zeros_like(batch.loss_mask)
        for start in range(0, batch.num_samples, self.cfg.micro_batch_size):
            mb = batch.select(torch.arange(start, min(start + self.cfg.micro_batch_size, batch.num_samples)))
            v = self.model(mb.input_ids.to(self.device), mb.attention_mask.to(self.device))
            out[start : start + mb.num_samples, : v.shape[1]] = v.float().cpu()
        return out * batch.loss_mask

    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        """num_steps_per_rollout optimizer steps on batch.returns / batch.values -> train/value_* metrics."""
        if batch.returns is None or batch.values is None:
            raise ValueError("TorchCritic.train_rollout needs batch.returns and batch.values (advantage_estimator=ppo)")
        steps = self.cfg.num_steps_per_rollout
        gbs = batch.num_samples // steps
        mode = self.algo.loss_aggregation
        metric_mode = L.metric_aggregation(mode)
        sums: dict[str, float] = defaultdict(float)
        for step in range(steps):
            idx = torch.arange(step * gbs, (step + 1) * gbs)
            denom = L.step_denominator([batch.loss_mask[idx]], mode, self.max_response_len)
            metric_denom = L.step_denominator([batch.loss_mask[idx]], metric_mode)
            self.optimizer.zero_grad(set_to_none=True)
            m: dict[str, float] = defaultdict(float)
            for start in range(0, gbs, self.cfg.micro_batch_size):
                mb_idx = idx[start : start + self.cfg.micro_batch_size]
                mb = batch.select(mb_idx)
                mask = mb.loss_mask.to(self.device)
                v = self.model(mb.input_ids.to(self.device), mb.attention_mask.to(self.device))  # [n, T]
                loss_tok, clipped = value_loss(v, mb.values.to(self.device, v.dtype), mb.returns.to(self.device, v.dtype),
                                               self.algo.value_clip)
                loss = 0.5 * L.aggregate(loss_tok, mask, mode, denom)  # 0.5 x squared error: dL/dV = V - G
                loss.backward()
                m["train/value_loss"] += loss.item()
                m["train/value_clipfrac"] += L.aggregate(clipped, mask, metric_mode, metric_denom).item()
                m["train/values_mean"] += L.aggregate(v.detach(), mask, metric_mode, metric_denom).item()
            max_norm = self.cfg.clip_grad if self.cfg.clip_grad > 0 else float("inf")
            m["train/value_grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
            self.optimizer.step()
            self.scheduler.step()
            for k, val in m.items():
                sums[k] += val / steps
        return dict(sums)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
