"""PPO's value model for `train.backend=torch`: the policy's transformer body plus a scalar head.

As slime's critic, it starts from the policy's weights (after any warm start) with a fresh value
head (zero-initialised, so the first values are 0), has its own AdamW (the CriticSpec's OptimSpec:
`train.critic_lr`, the policy's lr schedule shape) and trains on the clipped value loss (`value_clip`)
of the returns GAE gives, aggregated like the policy loss (the LossSpec's `loss_aggregation`).
Layout: values[:, t] = V(tokens[: t + 1]), the value of the state that predicts token t + 1, so it
lines up with the loss mask and the advantages ([N, T], see training/batch.py).
"""

from __future__ import annotations

import copy
from collections import defaultdict

import torch
from torch import nn

from slime_hydra.algorithms import losses as L
from slime_hydra.algorithms.critic import value_loss
from slime_hydra.protocols import TrainBatch
from slime_hydra.training.collectives import ONE_PROCESS, Collectives
from slime_hydra.training.microbatch import micro_batch_indices
from slime_hydra.training.optim import VALUE_SKIPPED_STEPS, adamw, clip_and_step
from slime_hydra.training.rollout_schedule import optimizer_steps
from slime_hydra.training.schedule import lr_multiplier
from slime_hydra.training.specs import BatchSpec, CriticSpec, LossSpec
from slime_hydra.training.thd import Packed, pack, thd_forward, unpack


def no_critic_in(checkpoint: str) -> str:
    """The problem of resuming PPO (a critic to restore) from a checkpoint written without one."""
    return (f"{checkpoint} holds no critic (its run's algorithm.advantage_estimator was not ppo), and this run's PPO "
            "critic has nothing to resume from; start from its policy instead: set model.hf_checkpoint to the checkpoint's "
            "directory (its Hugging Face weights; the critic then starts from them) and leave out load=")


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

    def packed(self, p: Packed) -> torch.Tensor:
        """[S] values of a packed micro-batch (train.qkv_format=thd, training/thd.py)."""
        return self.value_head(thd_forward(self.body, p).last_hidden_state[0]).squeeze(-1)


class TorchCritic:
    def __init__(self, policy: nn.Module, spec: CriticSpec, batch: BatchSpec, loss: LossSpec, device: torch.device,
                 collectives: Collectives = ONE_PROCESS):
        """loss: the policy's LossSpec, whose aggregation (and its max_response_len) the value loss shares; collectives:
        the policy's (a step's denominators and gradients summed over data-parallel ranks)."""
        self.spec, self.batch, self.device, self.collectives = spec, batch, device, collectives
        self.loss_aggregation, self.max_response_len = loss.loss_aggregation, loss.max_response_len
        self.model = ValueModel(policy).to(device).train()
        o = spec.optim
        self.optimizer = adamw(self.model.parameters(), o.adam_impl, lr=o.lr, betas=(o.adam_beta1, o.adam_beta2),
                               eps=o.adam_eps, weight_decay=o.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_multiplier(o.lr_decay_style, o.lr_warmup_iters, o.total_steps, o.lr, o.min_lr))

    def reset_from(self, policy: nn.Module) -> None:
        """Re-copy the body from the policy (after the warm start changed it), keeping the zero head."""
        self.model.body.load_state_dict(getattr(policy, policy.base_model_prefix).state_dict())

    def _micro_batches(self, batch: TrainBatch, idx: torch.Tensor, forward_only: bool) -> list[torch.Tensor]:
        """Rows `idx` by micro_batch_size or by the token budget (padded tokens: the HF body pads unless packed)."""
        b = self.batch
        return micro_batch_indices(idx, batch.attention_mask.sum(-1), b.micro_batch_size,
                                   b.log_probs_max_tokens_per_gpu if forward_only else b.max_tokens_per_gpu,
                                   padded=b.qkv_format != "thd")

    def _values(self, mb: TrainBatch) -> torch.Tensor:
        """[n, T] values of a micro-batch; packed into one row with train.qkv_format=thd (0 past each row's end)."""
        ids, attn = mb.input_ids.to(self.device), mb.attention_mask.to(self.device)
        if self.batch.qkv_format == "thd":
            p = pack(ids, attn)
            return unpack(self.model.packed(p), p)
        return self.model(ids, attn)

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> torch.Tensor:
        """[N, T] values of the rollout's states (the old values of the value loss), zero off the mask."""
        out = torch.zeros_like(batch.loss_mask)
        for rows in self._micro_batches(batch, torch.arange(batch.num_samples), forward_only=True):
            mb = batch.select(rows)
            v = self._values(mb)
            out[rows, : v.shape[1]] = v.float().cpu()
        return out * batch.loss_mask

    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        """num_steps_per_rollout optimizer steps on batch.returns / batch.values -> train/value_* metrics."""
        if batch.returns is None or batch.values is None:
            raise ValueError("TorchCritic.train_rollout needs batch.returns and batch.values (advantage_estimator=ppo)")
        return optimizer_steps(batch, self.batch.num_steps_per_rollout, lambda step, idx: self._step(batch, idx))

    def _step(self, batch: TrainBatch, idx: torch.Tensor) -> dict[str, float]:
        mode, sum_ = self.loss_aggregation, self.collectives.sum
        metric_mode = L.metric_aggregation(mode)
        denom = sum_(L.step_denominator([batch.loss_mask[idx]], mode, self.max_response_len))  # the whole step's
        metric_denom = sum_(L.step_denominator([batch.loss_mask[idx]], metric_mode))
        self.optimizer.zero_grad(set_to_none=True)
        m: dict[str, float] = defaultdict(float)
        for mb_idx in self._micro_batches(batch, idx, forward_only=False):
            mb = batch.select(mb_idx)
            mask = mb.loss_mask.to(self.device)
            v = self._values(mb)  # [n, T]
            loss_tok, clipped = value_loss(v, mb.values.to(self.device, v.dtype), mb.returns.to(self.device, v.dtype),
                                           self.spec.value_clip)
            loss = 0.5 * L.aggregate(loss_tok, mask, mode, denom)  # 0.5 x squared error: dL/dV = V - G
            loss.backward()
            m["train/value_loss"] += loss.item()
            m["train/value_clipfrac"] += L.aggregate(clipped, mask, metric_mode, metric_denom).item()
            m["train/values_mean"] += L.aggregate(v.detach(), mask, metric_mode, metric_denom).item()
        self.collectives.reduce_gradients([p for p in self.model.parameters() if p.grad is not None])
        m["train/value_grad_norm"], stepped = clip_and_step(list(self.model.parameters()), self.optimizer,
                                                            self.spec.optim.clip_grad)
        m[VALUE_SKIPPED_STEPS] = float(not stepped)
        self.scheduler.step()
        return m

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
