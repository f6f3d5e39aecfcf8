"""Build a run's Components: the local builder (one process), or the Ray builder (app/build_ray.py) when
cluster.backend=ray. Names become objects here: train.backend picks the trainer, rollout.backend the engine.

Both builders share app/inputs.py: data before any model (a bad data file fails in a second), and a
resume that restores every piece of state the loop reads.
"""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from slime_hydra.app.algorithm import run_specs
from slime_hydra.app.build_ray import build_ray
from slime_hydra.app.debug_split import open_replay
from slime_hydra.app.inputs import assemble, build_source, make_tracker, prepare
from slime_hydra.app.plugins import load_target
from slime_hydra.config.schema import RunConfig
from slime_hydra.data.rollout_dump import ReplayBuffer
from slime_hydra.engine.components import Components, restore
from slime_hydra.engine.offload import trainer_released
from slime_hydra.models.build import build_model
from slime_hydra.protocols import RolloutBackend, TrainBackend
from slime_hydra.rollout.local import LocalRollout
from slime_hydra.rollout.replay import NoWeightSync, ReplayRollout
from slime_hydra.rollout.sglang.checks import num_engines
from slime_hydra.runtime import pick_device
from slime_hydra.training.noop import NoTrain
from slime_hydra.training.specs import AlgorithmSpecs
from slime_hydra.training.torch_backend import TorchTrainBackend


def build_trainer(cfg: RunConfig, s: AlgorithmSpecs, model: torch.nn.Module, device: torch.device) -> TrainBackend:
    if cfg.train.backend == "megatron":  # GPTModel initialised from the HF model's weights (the rollout keeps the HF model)
        from slime_hydra.training.megatron.trainer import build_trainer as megatron  # megatron.core: ~6 s, megatron runs only

        return megatron(model.state_dict(), model.config, cfg.model, cfg.parallelism, cfg.train.megatron, s,
                        cfg.rollout.rollout_temperature, device, seed=cfg.seed,
                        distributed_timeout_s=cfg.cluster.distributed_timeout_s)
    return TorchTrainBackend(model, s.loss, s.optim, s.batch, cfg.rollout.rollout_temperature, device, critic=s.critic,
                             model_impl=cfg.model.model_impl)


def build_rollout(cfg: RunConfig, model: torch.nn.Module, tokenizer, output_dir: str = ".",
                  trainer: Optional[TrainBackend] = None) -> RolloutBackend:
    """trainer: released while SGLang engines start, with cluster.offload_train (each engine then sizes its KV cache on a
    GPU the trainer does not hold: docs/memory.md)."""
    if cfg.rollout.backend == "sglang":
        from slime_hydra.app.sglang_attach import sglang_attachments
        from slime_hydra.rollout.sglang.backend import SGLangRollout  # its client and weight-sync stack: sglang runs only

        c, external = cfg.cluster, cfg.rollout.rollout_external_engine_addrs
        offload = c.offload_rollout if c.offload_rollout is not None else c.colocate
        released = bool(c.offload_train) and trainer is not None
        attach = sglang_attachments(cfg.rollout)
        return SGLangRollout(cfg.rollout, model, tokenizer, num_engines=num_engines(c, external),
                             tp_size=c.rollout_num_gpus_per_engine,
                             seed=cfg.seed, dtype=cfg.model.dtype, output_dir=output_dir, colocate=c.colocate,
                             offload=offload, device=pick_device(c.device).type, keep_on_host=released,
                             starting=partial(trainer_released, trainer, released),
                             post_write=load_target(cfg.rollout.custom_update_weight_post_write), **attach)
    return LocalRollout(model, tokenizer, seed=cfg.seed, generation_batch_size=cfg.rollout.generation_batch_size,
                        model_impl=cfg.model.model_impl)


def build(cfg: RunConfig, output_dir: str, parent_run_id: Optional[str] = None) -> Components:
    """The run's Components: in this process, or as Ray actors (cluster.backend=ray); the loop runs either."""
    if cfg.cluster.num_threads:
        torch.set_num_threads(cfg.cluster.num_threads)
    if cfg.cluster.backend == "ray":  # placement group, train group, rollout manager: the same Components
        return build_ray(cfg, output_dir, parent_run_id)
    inputs = prepare(cfg)
    dump = open_replay(cfg, inputs.tokenizer, inputs.state)  # load_debug_rollout_data: checked before any model is built
    source = build_source(cfg, inputs.tokenizer, inputs.train_prompts)  # streaming: its workers read while the model builds
    device = pick_device(cfg.cluster.device)
    # on the device only where it runs there (the torch trainer's own model, the local engine's copy): megatron copies
    # it into its own tensors, and SGLang engines load it from disk
    on_device = cfg.train.backend == "torch" or cfg.rollout.backend == "local"
    model = build_model(inputs.model, inputs.tokenizer, cfg.seed).to(device if on_device else torch.device("cpu"))
    specs = run_specs(cfg)  # names turned into the trainer's and the advantage step's callables
    if cfg.debug_rollout_only:  # slime's --debug-rollout-only: generate, score and dump; nothing trains
        trainer: TrainBackend = NoTrain()
        print("debug_rollout_only: no trainer built (no optimizer, no weight sync; checkpoints hold no weights)", flush=True)
    else:
        trainer = build_trainer(cfg, specs, model, device)
    tracker = make_tracker(cfg, inputs, output_dir, parent_run_id)
    buffer = None
    if dump is not None:  # slime's --load-debug-rollout-data: the dump's samples, no engine
        start = inputs.state["rollout_id"] + 1 if inputs.state else 0
        rollout: RolloutBackend = ReplayRollout(dump)
        buffer = ReplayBuffer(dump, source, start)
    else:
        rollout = build_rollout(cfg, model, inputs.tokenizer, output_dir, trainer)
        rollout = NoWeightSync(rollout) if cfg.debug_rollout_only else rollout
    comps = assemble(cfg, inputs, source, trainer, rollout, tracker, specs.advantage, output_dir, buffer)
    if inputs.state is not None:
        restore(comps, inputs.state)
    return comps
