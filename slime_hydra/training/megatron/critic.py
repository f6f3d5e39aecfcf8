"""PPO's value model for `train.backend=megatron`: a second GPTModel of the policy's layout with a scalar head.

As TorchCritic (training/critic.py): it starts from the policy's weights (MegatronTrainBackend.freeze_reference, after
any warm start: reset_from copies this stage's shards) with a zero-initialised value head, so the first values are 0;
it has its own megatron optimizer (the CriticSpec's OptimSpec: train.critic_lr, the policy's schedule shape) and
trains on the same clipped value loss, 0.5·agg(max((V_clip - G)², (V - G)²)), aggregated like the policy loss with the
whole step's denominator. It runs through the policy's runner (runner.py: micro-batches and token budgets, THD packing,
megatron's pipeline schedule, DP share of the rows, metrics summed over DP and taken from the last stage), so its
gradients are all-reduced over DP by megatron's DDP as the policy's are, in any TP/PP/DP layout.

The value head replaces GPTModel's output layer on the last pipeline stage: hidden -> 1, replicated on every TP rank
(each computes the same values from the full hidden state; with sequence parallelism the sequence is gathered first,
its gradient split back as megatron's output layer would). Being replicated, its gradient needs no TP reduction, and
megatron's grad norm counts it once (it is not a tensor-parallel parameter). The critic GPT never ties the (discarded)
output layer to the embedding, so no embedding-group all-reduce joins it with a [V, H] weight.
Layout: values[:, t] = V(tokens[: t + 1]), as training/critic.py.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import torch
from megatron.core import parallel_state as ps
from megatron.core.tensor_parallel import gather_from_sequence_parallel_region
from megatron.core.transformer.module import MegatronModule

from slime_hydra.algorithms import losses as L
from slime_hydra.algorithms.critic import value_loss
from slime_hydra.protocols import TrainBatch
from slime_hydra.training.megatron.runner import MegatronRunner
from slime_hydra.training.optim import VALUE_SKIPPED_STEPS
from slime_hydra.training.rollout_schedule import optimizer_steps
from slime_hydra.training.schedule import lr_multiplier
from slime_hydra.training.specs import CriticSpec, LossSpec
from slime_hydra.training.thd import unpack


class ValueHead(MegatronModule):
    """GPTModel.output_layer's call (hidden [s, b, H], weight=, runtime_gather_output=) -> ([s, b, 1], None)."""

    def __init__(self, config, hidden_size: int):
        super().__init__(config)
        # `weight` and `bias` at the top: GPTModel.sharded_state_dict looks up `output_layer.weight`
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=config.params_dtype))
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=config.params_dtype))

    def forward(self, hidden: torch.Tensor, weight=None, runtime_gather_output=None):
        if self.config.sequence_parallel:  # [s/tp, b, H] -> [s, b, H]; backward: each rank keeps its slice's gradient
            hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden, self.weight, self.bias), None


class MegatronCritic:
    def __init__(self, runner: MegatronRunner, policy: torch.nn.Module, spec: CriticSpec, loss: LossSpec):
        """runner: the policy's (its layout, micro-batching, schedule and collectives); policy: the GPT whose body the
        critic starts from. loss: the policy's LossSpec, whose aggregation the value loss shares."""
        self.runner, self.spec = runner, spec
        self.loss_aggregation, self.max_response_len = loss.loss_aggregation, loss.max_response_len
        gpt = runner.new_gpt(model=dataclasses.replace(runner.model, untie_embeddings_and_output_weights=True))
        if ps.is_pipeline_last_stage():
            gpt.output_layer = ValueHead(runner.config, runner.model.hidden_size).to(runner.device)
        self.gpt = gpt
        self._copy_body(policy)
        self.ddp = runner.wrap(self.gpt)
        o = spec.optim
        self.optimizer = runner.optimizer(self.ddp, o, o.lr, o.weight_decay)
        self.lr_at = lr_multiplier(o.lr_decay_style, o.lr_warmup_iters, o.total_steps, o.lr, o.min_lr)
        self.steps_done = 0

    def reset_from(self, policy: torch.nn.Module) -> None:
        """Re-copy this stage's body from the policy (after the warm start changed it), keeping the head. bf16 / fp16:
        the optimizer's fp32 main params are copies taken when it was built: copied again."""
        self._copy_body(policy)
        self.ddp.zero_grad_buffer()
        self.optimizer.reload_model_params()

    def _copy_body(self, policy: torch.nn.Module) -> None:
        body = {k: v for k, v in policy.state_dict().items() if not k.startswith("output_layer.")}
        missing, unexpected = self.gpt.load_state_dict(body, strict=False)
        left = [k for k in missing if not k.startswith("output_layer.")]
        if left or unexpected:
            raise KeyError(f"critic <- policy copy: missing {left[:4]}, unexpected {unexpected[:4]}")

    def _values(self, mb: TrainBatch, out: torch.Tensor) -> torch.Tensor:
        """[n, T] values of a micro-batch from the model's [b, s, 1] output (packed: [1, S, 1], 0 past a row's end)."""
        if self.runner.thd:
            return unpack(out[0, :, 0], mb.packed)
        return out[:, : mb.loss_mask.shape[1], 0]

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> torch.Tensor:
        """[N, T] values of the rollout's states (the old values of the value loss), zero off the mask, on every rank."""
        return self.runner.per_token(self.ddp, batch, self._values) * batch.loss_mask

    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        """num_steps_per_rollout optimizer steps on batch.returns / batch.values -> train/value_* metrics."""
        if batch.returns is None or batch.values is None:
            raise ValueError("MegatronCritic.train_rollout needs batch.returns and batch.values (advantage_estimator=ppo)")
        return optimizer_steps(batch, self.runner.batch.num_steps_per_rollout, lambda step, idx: self._step(batch, idx))

    def _step(self, batch: TrainBatch, idx: torch.Tensor) -> dict[str, float]:
        r, mode = self.runner, self.loss_aggregation
        metric_mode = L.metric_aggregation(mode)
        denom = L.step_denominator([batch.loss_mask[idx]], mode, self.max_response_len)  # the whole step's
        metric_denom = L.step_denominator([batch.loss_mask[idx]], metric_mode)
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        outs = r.run(self.ddp, r.share_micro_batches(batch, idx),
                     partial(self._loss, denom=denom, metric_mode=metric_mode, metric_denom=metric_denom), forward_only=False)
        m = r.step_metrics(outs)
        m["train/value_grad_norm"] = r.optimizer_step(self.optimizer, self.lr_at(self.steps_done) * self.spec.optim.lr)
        m[VALUE_SKIPPED_STEPS] = float(r.last_step_skipped)
        self.steps_done += 1
        return m

    def _loss(self, mb: TrainBatch, out: torch.Tensor, denom: float, metric_mode: str, metric_denom: float):
        """One micro-batch on the last stage: (loss, 1, metrics), TorchCritic's value loss."""
        dev = self.runner.device
        mask = mb.loss_mask.to(dev)
        v = self._values(mb, out)  # [n, T]
        loss_tok, clipped = value_loss(v, mb.values.to(dev, v.dtype), mb.returns.to(dev, v.dtype), self.spec.value_clip)
        loss = 0.5 * L.aggregate(loss_tok, mask, self.loss_aggregation, denom)  # 0.5 x squared error: dL/dV = V - G
        metrics = {"value_loss": loss.detach(), "value_clipfrac": L.aggregate(clipped, mask, metric_mode, metric_denom),
                   "values_mean": L.aggregate(v.detach(), mask, metric_mode, metric_denom)}
        return loss, torch.tensor(1, device=dev), metrics
