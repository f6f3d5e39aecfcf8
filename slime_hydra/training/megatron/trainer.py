"""The megatron TrainBackend: same Protocol, rollout schedule, batch split, old log-probs and loss functions as
train=torch; megatron's side (models, pipeline schedule, log-probs, DP/PP collectives) is the runner's (runner.py) and the
Hugging Face weights out are export.py's.

One rollout gives `num_steps_per_rollout` optimizer steps (training/rollout_schedule.py, as the torch backend); a step's
kept samples, this DP rank's share of them, are split into micro-batches that megatron's pipeline schedule runs. The
micro-batch loss is the torch backend's (training/policy_loss.py: PPO-clip / GSPO / CISPO, TIS, KL loss, entropy,
aggregation) over the whole step's denominator; only the log-probs differ in how they are computed (vocab-parallel).
Checkpoints: `save_checkpoint` / `load_checkpoint` write and read megatron's distributed format (checkpoint.py; any
TP/PP layout); the engine's save/load go through them (TrainBackend.save_checkpoint: `<ckpt>/megatron/` beside the HF
weights; state_dict is None: nothing of the trainer in the state files). Given a CriticSpec (ppo) the backend owns a critic
(critic.py: a second GPT of the runner's layout with a value head, its own optimizer, saved with the policy in
`<ckpt>/megatron/`), trained on every rollout before the policy; the policy sits out its first num_critic_only_steps
rollouts, and ref_update_interval re-snapshots the KL reference, as under train=torch.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from slime_hydra.algorithms import losses as L
from slime_hydra.config.schema import MegatronConfig, ModelConfig, ParallelismConfig
from slime_hydra.models.hf_check import moe_layer_pattern
from slime_hydra.protocols import InProcessWeights, TrainBatch
from slime_hydra.training.base import shaping_kl
from slime_hydra.training.gpu_memory import device_used, release_figures, step_figures
from slime_hydra.training.megatron import convert
from slime_hydra.training.megatron.critic import MegatronCritic
from slime_hydra.training.megatron.export import HFExport
from slime_hydra.training.megatron.parallel import init_parallel
from slime_hydra.training.megatron.router_load import RouterLoad
from slime_hydra.training.megatron.runner import MegatronRunner
from slime_hydra.training.offload import HostOffload, module_tensors, optimizer_tensors
from slime_hydra.training.optim import SKIPPED_STEPS
from slime_hydra.training.policy_loss import old_log_probs
from slime_hydra.training.rollout_schedule import RolloutSchedule
from slime_hydra.training.schedule import lr_multiplier
from slime_hydra.training.specs import AlgorithmSpecs, CriticSpec, LossSpec, OptimSpec, RankHooks


def build_trainer(hf_weights, hf_config, model: ModelConfig, parallel: ParallelismConfig, megatron: MegatronConfig,
                  specs: AlgorithmSpecs, temperature: float, device: torch.device, *, seed: int = 1234,
                  distributed_timeout_s: float = 1800.0, sdpa: bool = True) -> MegatronTrainBackend:
    """megatron's process groups for `parallel` (bounded by `distributed_timeout_s`), the runner of that layout, the
    policy from `hf_weights` (HF name -> tensor: a state dict or convert.SafetensorsDir; None: megatron's random
    initialisation, for benchmarks) and the trainer. hf_config: the HF model's transformers config (vocab, config.json)."""
    problems = convert.check_convertible(model)
    if problems:
        raise ValueError(problems[0])
    init_parallel(parallel, seed, "nccl" if device.type == "cuda" else "gloo", distributed_timeout_s)
    if specs.hooks.init is not None:  # train.custom_megatron_init: megatron set up, no model yet (slime's point)
        specs.hooks.init()
    runner = MegatronRunner(model, parallel, megatron, specs.batch, hf_config.vocab_size, temperature, device, sdpa)
    return MegatronTrainBackend(runner, runner.new_gpt(hf_weights), HFExport(runner, hf_config), specs.loss, specs.optim,
                                specs.critic, specs.hooks)


class MegatronTrainBackend:
    def __init__(self, runner: MegatronRunner, policy: torch.nn.Module, export: HFExport, loss: LossSpec, optim: OptimSpec,
                 critic: Optional[CriticSpec] = None, hooks: Optional[RankHooks] = None):
        """policy: a GPT of the runner's layout (runner.new_gpt); critic (ppo): the value model's spec (critic.py);
        hooks: train.custom_megatron_* (RankHooks)."""
        self.runner, self.export, self.loss, self.optim = runner, export, loss, optim
        self.hooks = hooks or RankHooks(None, None, None)
        self.gpt = policy
        self.ddp = runner.wrap(policy)
        self.optimizer = runner.optimizer(self.ddp, optim, optim.lr, optim.weight_decay)
        self.lr_at = lr_multiplier(optim.lr_decay_style, optim.lr_warmup_iters, optim.total_steps, optim.lr, optim.min_lr)
        self.steps_done = 0
        self.ref: Optional[torch.nn.Module] = None
        self._ref_all: Optional[torch.Tensor] = None  # [N, T] the rollout's reference log-probs, with PP > 1 (KL loss)
        self._sft_optimizer = None
        self.critic = MegatronCritic(runner, policy, critic, loss) if critic is not None else None
        self.schedule = RolloutSchedule.of(loss, runner.batch, critic)
        self.offload = HostOffload()  # cluster.offload_train: release_memory / resume_memory
        m = runner.model  # MoE: the routers' load-balancing loss and expert load per step (router_load.py)
        self.router_load = RouterLoad(policy, runner.config, m.num_layers, m.num_experts, moe_layer_pattern(m.moe_layer_freq, m.num_layers),
                                      m.moe_aux_loss_coeff, runner.device) if m.num_experts else None

    def freeze_reference(self) -> None:
        """After any warm start: snapshot the KL reference, and start the critic from the policy's body."""
        if self.loss.keep_reference:
            self.ref = self.runner.new_gpt().eval().requires_grad_(False)
            self.ref.load_state_dict(self.gpt.state_dict())
        if self.critic is not None:
            self.critic.reset_from(self.gpt)

    # -- forward -----------------------------------------------------------------------------
    @torch.no_grad()
    def compute_log_probs(self, batch: TrainBatch, model=None) -> torch.Tensor:
        """[N, T] log-probs of every target under `model` (default: the policy), by micro-batch, on every rank."""
        if self.hooks.before_log_prob is not None:  # train.custom_megatron_before_log_prob_hook: slime's store prefixes
            self.hooks.before_log_prob([model or self.ddp], "ref_" if model is not None and model is self.ref else "")
        return self.runner.per_token(model or self.ddp, batch, lambda mb, logits: self.runner.log_probs(mb, logits, False)[0])

    @torch.no_grad()
    def reward_kl(self, batch: TrainBatch) -> torch.Tensor:
        return shaping_kl(batch, self.loss, self.compute_log_probs, self.ref)

    def values(self, batch: TrainBatch) -> torch.Tensor:
        """Collective: [N, T] the critic's values on the loss mask, on every rank."""
        if self.critic is None:
            raise RuntimeError("values() needs the critic (a CriticSpec: algorithm.advantage_estimator=ppo)")
        return self.critic.values(batch)

    # -- RL ----------------------------------------------------------------------------------
    def train_rollout(self, batch: TrainBatch) -> dict[str, float]:
        critic = None if self.critic is None else self.critic.train_rollout
        self._ref_all = self.reference_log_probs(batch)
        try:
            metrics = self.schedule.train(batch, self._train_step, self.compute_log_probs, critic, self.ref, self.gpt)
        finally:
            self._ref_all = None
        return metrics | step_figures(self.runner.device)

    def reference_log_probs(self, batch: TrainBatch) -> Optional[torch.Tensor]:
        """[N, T] the reference's log-probs for the KL loss when the pipeline has stages, else None. A micro-batch's loss
        runs on the last stage, which holds only the reference's last layers, so the reference runs once per rollout
        through the whole pipeline beforehand (forward only, as the old log-probs do); it changes only after the
        rollout (ref_update_interval). With one stage the loss runs the reference itself, micro-batch by micro-batch."""
        if self.ref is None or not self.loss.use_kl_loss or self.runner.parallel.pipeline_model_parallel_size == 1:
            return None
        return self.compute_log_probs(batch, self.ref)

    def _train_step(self, batch: TrainBatch, idx: torch.Tensor, old_all: Optional[torch.Tensor]) -> dict[str, float]:
        r, mode = self.runner, self.loss.loss_aggregation
        denom = L.step_denominator([batch.loss_mask[idx]], mode, self.loss.max_response_len)
        keep = idx[(batch.advantages[idx] != 0).any(-1)] if r.batch.skip_zero_advantage_samples else idx
        metric_mode = L.metric_aggregation(mode)
        metric_denom = max(1.0, L.step_denominator([batch.loss_mask[keep]], metric_mode))
        mbs = r.share_micro_batches(batch, keep)  # mb.idx: the rows of old_all each micro-batch reads
        if self.hooks.before_train_step is not None:  # train.custom_megatron_before_train_step_hook; steps are equal slices
            self.hooks.before_train_step(self.schedule.rollouts_trained, int(idx[0]) // len(idx), [self.ddp], self.optimizer)
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        if self.router_load is not None:
            self.router_load.begin_step(sum(not getattr(mb, "zero", False) for mb in mbs))
        outs = r.run(self.ddp, mbs, partial(self._loss, old_all=old_all, denom=denom, metric_mode=metric_mode,
                                            metric_denom=metric_denom), forward_only=False)
        m = r.step_metrics(outs)
        if self.router_load is not None:
            m |= self.router_load.metrics()
        m["train/grad_norm"] = r.optimizer_step(self.optimizer, self.lr_at(self.steps_done) * self.optim.lr)
        m[SKIPPED_STEPS] = float(r.last_step_skipped)
        self.steps_done += 1
        m["train/lr"] = self.lr_at(self.steps_done) * self.optim.lr
        m["train/kept_samples"] = float(len(keep))
        return dict(m)

    def _loss(self, mb: TrainBatch, logits: torch.Tensor, old_all, denom: float, metric_mode: str, metric_denom: float):
        """One micro-batch on the last stage: (loss, 1, metrics), the LossSpec's objective (the torch backend's) on vocab-parallel log-probs."""
        spec, dev = self.loss, self.runner.device
        mask, adv = mb.loss_mask.to(dev), mb.advantages.to(dev)
        logp, ent = self.runner.log_probs(mb, logits, with_entropy=bool(spec.entropy_coef))  # [n, T]
        rollout_lp = mb.rollout_log_probs.to(dev) if mb.rollout_log_probs is not None else None
        old = old_log_probs(spec, logp, rollout_lp, None if old_all is None else old_all[mb.idx])
        loss, scalars, per_token = spec.objective(spec, logp, ent, old, adv, mask, rollout_lp, lambda: self._ref_logp(mb), denom)
        metrics = {k: v.detach() for k, v in scalars.items()}
        metrics |= {k: L.aggregate(t.detach(), mask, metric_mode, metric_denom) for k, t in per_token.items()}
        return loss, torch.tensor(1, device=dev), metrics

    def _ref_logp(self, mb: TrainBatch) -> torch.Tensor:
        """[n, T] reference log-probs of one micro-batch: the rollout's, taken through the pipeline (PP > 1), or the
        reference run whole on this rank (PP = 1)."""
        if self._ref_all is not None:
            return self._ref_all[mb.idx, : mb.loss_mask.shape[1]].to(self.runner.device)  # the micro-batch's width
        with torch.no_grad():
            return self.runner.log_probs(mb, self.runner.forward(self.ref, mb), False)[0]

    # -- SFT warm start ----------------------------------------------------------------------
    def sft_step(self, batch: TrainBatch, lr: float) -> float:
        r = self.runner
        if self._sft_optimizer is None:  # torch backend's SFT AdamW defaults
            self._sft_optimizer = r.optimizer(self.ddp, self.optim, lr, 0.0, betas=(0.9, 0.999), eps=1e-8)
        mode = L.metric_aggregation(self.loss.loss_aggregation)
        denom = L.step_denominator([batch.loss_mask], mode)

        def loss_fn(mb, logits):
            lp, _ = r.log_probs(mb, logits, with_entropy=False)
            loss = L.aggregate(L.sft_token_loss(lp), mb.loss_mask.to(r.device), mode, denom)
            return loss, torch.tensor(1, device=r.device), {"loss": loss.detach()}

        # this DP rank's share of the rows, as in _train_step: the gradients are summed over DP, so a rank that took every
        # row made the step's gradient DP times the one-process one (grad norm 13.81 vs 6.90 at DP=2, before clipping)
        rows = torch.arange(batch.num_samples)
        self.ddp.zero_grad_buffer()
        self._sft_optimizer.zero_grad()
        mbs = r.share_micro_batches(batch, rows)
        if self.router_load is not None:
            self.router_load.begin_step(sum(not getattr(mb, "zero", False) for mb in mbs))
        outs = r.run(self.ddp, mbs, loss_fn, forward_only=False)
        r.optimizer_step(self._sft_optimizer, lr)
        loss = r.sum_over_dp({"loss": sum(float(o["loss"]) for o in outs)})  # shares of the whole batch's denominator
        return r.from_last_stage(loss["loss"])

    def end_warm_start(self) -> None:
        """The warm start's optimizer moved the weights; the RL optimizer's fp32 main params (bf16 / fp16 models) are
        copies taken when it was built and would overwrite them at its first step: they are copied again."""
        self._sft_optimizer = None
        self.ddp.zero_grad_buffer()
        self.optimizer.reload_model_params()

    # -- weights and state -------------------------------------------------------------------
    def named_weights(self) -> InProcessWeights:
        """HF names and full (TP-gathered: iterating is a collective of the TP group) tensors of this stage's weights."""
        return InProcessWeights(lambda: self.export.named_weights(self.gpt))

    def named_weights_all_stages(self) -> list[tuple[str, torch.Tensor]]:
        """Collective: every pipeline stage's weights, on the first stage's ranks (export.HFExport.all_stages)."""
        return self.export.all_stages(self.gpt)

    def save_hf(self, path: str, tokenizer=None) -> None:
        self.export.save(self.gpt, path, tokenizer)

    def state_dict(self) -> None:
        """None: the whole resume state is save_checkpoint's `<ckpt>/megatron/` (nothing of the trainer in the state files)."""
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
        out = {"steps_done": self.steps_done, "rollouts_trained": self.schedule.rollouts_trained}
        return out | ({"critic_steps_done": self.critic.steps_done} if self.critic is not None else {})

    def release_memory(self) -> dict[str, float]:
        """The policy (its DDP parameter and gradient buffers), the fp32 main parameters and Adam's moments of every
        megatron optimizer (the warm start's too), the reference, and the critic's model and optimizer."""
        c = self.critic
        models = [self.ddp, self.ref] + ([c.ddp] if c is not None else [])
        optimizers = [self.optimizer, self._sft_optimizer] + ([c.optimizer] if c is not None else [])
        tensors = [t for m in models if m is not None for t in module_tensors(m)]
        tensors += [t for o in optimizers if o is not None
                    for inner in getattr(o, "chained_optimizers", [o]) for t in optimizer_tensors(inner.optimizer)]
        used = device_used(self.runner.device)
        return release_figures(self.runner.device, used, self.offload.release(tensors))

    def resume_memory(self) -> None:
        self.offload.resume()

    def load_checkpoint(self, path: str) -> None:
        """Collective: the inverse of save_checkpoint, into this run's layout (TP/PP may differ from the writer's, and with the
        distributed optimizer the DP size; the optimizer kind must be the writer's: checkpoint.check_loadable)."""
        from slime_hydra.training.megatron import checkpoint

        if self.ref is None and self.loss.keep_reference:
            self.ref = self.runner.new_gpt().eval().requires_grad_(False)
        c = self.critic
        extra = checkpoint.load(path, self.gpt, self.optimizer, self.ref, critic=None if c is None else (c.gpt, c.optimizer))
        self.steps_done = extra["steps_done"]
        self.schedule.rollouts_trained = extra.get("rollouts_trained", 0)
        if c is not None:
            c.steps_done = extra["critic_steps_done"]
