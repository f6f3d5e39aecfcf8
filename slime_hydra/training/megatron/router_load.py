"""The MoE routers of a policy GPT over one optimizer step: their load-balancing loss and the tokens each expert got.

- `train/moe_aux_loss`: megatron's load-balancing loss (aux_loss, seq_aux_loss or global_aux_loss, its aux-loss
  tracker; before the coefficient), per MoE layer the mean over the step's micro-batches of every DP rank, then the mean
  over the MoE layers. It exists only when model.moe_aux_loss_coeff > 0 (megatron computes it only then).
- `train/moe_expert_load_imbalance`: per MoE layer, the most tokens any expert received over the step divided by the
  mean per expert (1 is perfectly balanced, num_experts / topk the worst), the largest over the layers. Real tokens
  only: the runner hands the routers the padding mask (runner.MegatronRunner._padding_mask), and the load-balancing loss
  leaves padding out too, so both read the same under any parallel layout. A packed micro-batch (train.qkv_format=thd)
  leaves out each sample's last token (it predicts nothing), which a padded row still routes: the two formats' figures
  differ by those tokens (tests/training/test_packing.py).

The gradient of the load-balancing loss: megatron scales it by each micro-batch's tokens and expects the main loss's
gradients divided by the step's tokens (finalize_model_grads), while this backend's loss is already divided by the step's
denominator. Here each router attaches its loss unscaled (its calculate_per_token_loss off) and the coefficient megatron
reads at each forward is model.moe_aux_loss_coeff / the step's micro-batches (of every DP rank), so the step's gradient is
the coefficient times the mean of the micro-batches' losses, as the metric reads it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.transformer.moe import moe_utils
from megatron.core.transformer.moe.router import TopKRouter

AUX_NAMES = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss")


class RouterLoad:
    def __init__(self, gpt: torch.nn.Module, config, num_layers: int, num_experts: int, moe_layers: list[int],
                 aux_loss_coeff: float, device: torch.device):
        """gpt: the policy (its routers are watched); config: its TransformerConfig (moe_aux_loss_coeff is set per step);
        moe_layers: 1 per MoE layer of the whole model."""
        self.config, self.coeff, self.moe_layers = config, aux_loss_coeff, moe_layers
        self.device = device
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.float64, device=device)  # [L, E] tokens routed this step
        self.micro_batches = 1
        for module in gpt.modules():
            if isinstance(module, TopKRouter):
                module.calculate_per_token_loss = False
                module.register_forward_hook(self._count)

    def _count(self, router, inputs, output) -> None:
        if router.training and torch.is_grad_enabled():  # train steps only (log-probs run in eval, without grad)
            routing_map = output[1]  # [tokens, E] bool
            if len(inputs) > 1 and inputs[1] is not None:  # the padding mask ([s, b], True on padding): real tokens only
                routing_map = routing_map & ~inputs[1].reshape(-1, 1)
            self.counts[router.layer_number - 1] += routing_map.sum(0).double()

    def begin_step(self, num_micro_batches: int) -> None:
        """Collective over DP: zero the step's figures; the coefficient for the real (not zeroed) micro-batches of every
        DP rank."""
        self.counts.zero_()
        moe_utils.clear_aux_losses_tracker()
        total = torch.tensor([float(num_micro_batches)], device=self.device)
        if ps.get_data_parallel_world_size() > 1:
            dist.all_reduce(total, group=ps.get_data_parallel_group(with_context_parallel=False))
        self.micro_batches = max(float(total), 1.0)
        self.config.moe_aux_loss_coeff = self.coeff / self.micro_batches

    def metrics(self) -> dict[str, float]:
        """Collective over every rank: the step's `train/moe_*` figures (the same on every rank)."""
        out = {}
        moe = torch.tensor(self.moe_layers, dtype=torch.bool, device=self.device)
        counts = self.counts.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts)  # layers live on their stage; DP ranks saw their own tokens (TP ranks: a common factor)
        per_layer = counts[moe].max(1).values / counts[moe].mean(1).clamp_min(1e-12)
        if counts[moe].sum() > 0:
            out["train/moe_expert_load_imbalance"] = float(per_layer.max())
        if self.coeff > 0:
            out["train/moe_aux_loss"] = self._aux_loss(moe)
        return out

    def _aux_loss(self, moe: torch.Tensor) -> float:
        tracker = moe_utils.get_moe_layer_wise_logging_tracker()
        values = torch.zeros(len(self.moe_layers), device=self.device)
        for name in AUX_NAMES:
            if name in tracker:
                values += tracker[name]["values"].detach().float()
        if dist.is_initialized() and dist.get_world_size() > 1:
            # a layer's partial losses: its stage's, each TP×CP rank's share of the tokens, each DP rank's micro-batches
            for group in (ps.get_pipeline_model_parallel_group(), ps.get_tensor_and_context_parallel_group(),
                          ps.get_data_parallel_group(with_context_parallel=False)):
                if dist.get_world_size(group) > 1:
                    dist.all_reduce(values, group=group)
        return float(values[moe].sum() / self.micro_batches / int(moe.sum()))
