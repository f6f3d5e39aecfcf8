"""Instantiate the run's components from the typed config, at the seams, with typed values.

Data is loaded before any model is built, so a bad data file fails in a second, not after a
model load. Resuming restores every piece of state the loop reads.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from slime_hydra.agent.hook import check_sample_overrides, wrap_rollout
from slime_hydra.config.schema import RunConfig
from slime_hydra.data.dataset import Prompt, load_prompts
from slime_hydra.config.plugins import load_target
from slime_hydra.data.buffer import DataBuffer
from slime_hydra.data.source import PromptSource
from slime_hydra.engine import checkpoint as ckpt
from slime_hydra.engine.debug_split import check_resume, is_rollout_only, open_replay, rollout_dump_meta
from slime_hydra.data.rollout_dump import ReplayBuffer
from slime_hydra.rollout.replay import NoWeightSync, ReplayRollout
from slime_hydra.training.noop import NoTrain
from slime_hydra.config.validate import eval_datasets
from slime_hydra.errors import ConfigError
from slime_hydra.engine.steps import EvalSet, eval_sampling, rollout_sampling
from slime_hydra.models.build import build_model, build_tokenizer
from slime_hydra.rewards.compute import RewardScorer
from slime_hydra.rollout.base import RolloutBackend
from slime_hydra.tracking.base import Tracker, build_tracker
from slime_hydra.training.base import DistCheckpointing, TrainBackend
from slime_hydra.types import SamplingParams


@dataclass
class Components:
    tokenizer: object
    train_prompts: list[Prompt]
    eval_sets: dict[str, EvalSet]
    source: PromptSource
    trainer: TrainBackend
    rollout: RolloutBackend
    scorer: RewardScorer
    tracker: Tracker
    sampling: SamplingParams
    output_dir: str = "."
    start_rollout: int = 0
    history: list = field(default_factory=list)
    resumed_from: Optional[Path] = None
    buffer: Optional[DataBuffer] = None  # None: a first-in first-out buffer over `source`
    ready: dict = field(default_factory=dict)  # async: finished rollouts restored from a checkpoint, trained first
    rollout_dump_meta: dict = field(default_factory=dict)  # the header of save_debug_rollout_data's files

    def __post_init__(self):
        if self.buffer is None:
            self.buffer = DataBuffer(self.source)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def load_data(cfg: RunConfig, tokenizer) -> list[Prompt]:
    d = cfg.data
    return load_prompts(d.prompt_data, tokenizer, input_key=d.input_key, label_key=d.label_key,
                        metadata_key=d.metadata_key, apply_chat_template=d.apply_chat_template,
                        max_prompt_len=d.rollout_max_prompt_len, what="data.prompt_data", tool_key=d.tool_key,
                        on_bad_row=d.on_bad_row)


def build_eval_sets(cfg: RunConfig, tokenizer, sampling: SamplingParams) -> dict[str, EvalSet]:
    d, sets = cfg.data, {}
    for name, ds in eval_datasets(cfg).items():
        prompts = load_prompts(ds.path, tokenizer, input_key=ds.input_key, label_key=ds.label_key,
                               metadata_key=ds.metadata_key, apply_chat_template=d.apply_chat_template,
                               max_prompt_len=d.rollout_max_prompt_len, what=f"eval.eval_prompt_data.{name}",
                               tool_key=d.tool_key, on_bad_row=d.on_bad_row, key_prefix=f"eval.eval_prompt_data.{name}")
        scorer = RewardScorer(dataclasses.replace(cfg.reward, rm_type=ds.rm_type), cfg.eval.eval_reward_key)
        sets[name] = EvalSet(prompts, eval_sampling(ds, sampling), ds.n_samples_per_eval_prompt, scorer)
    return sets


def build_trainer(cfg: RunConfig, model: torch.nn.Module, device: torch.device) -> TrainBackend:
    total_steps = cfg.num_rollout * cfg.train.num_steps_per_rollout
    if cfg.train.backend == "megatron":  # GPTModel initialised from the HF model's weights (the rollout keeps the HF model)
        from slime_hydra.training.megatron.backend import MegatronTrainBackend

        return MegatronTrainBackend(model.state_dict(), model.config, cfg.model, cfg.parallelism, cfg.algorithm, cfg.train,
                                    cfg.rollout.rollout_temperature, total_steps, device, seed=cfg.seed,
                                    max_response_len=cfg.rollout.rollout_max_response_len,
                                    distributed_timeout_s=cfg.cluster.distributed_timeout_s)
    from slime_hydra.training.torch_backend import TorchTrainBackend

    return TorchTrainBackend(model, cfg.algorithm, cfg.train, cfg.rollout.rollout_temperature, total_steps, device,
                             max_response_len=cfg.rollout.rollout_max_response_len, model_impl=cfg.model.model_impl)


def build_rollout(cfg: RunConfig, model: torch.nn.Module, tokenizer, output_dir: str = ".") -> RolloutBackend:
    if cfg.rollout.backend == "sglang":
        from slime_hydra.rollout.sglang.backend import SGLangRollout
        from slime_hydra.rollout.sglang.checks import num_engines

        c = cfg.cluster
        offload = c.offload_rollout if c.offload_rollout is not None else c.colocate
        return SGLangRollout(cfg.rollout, model, tokenizer, num_engines=num_engines(cfg), tp_size=c.rollout_num_gpus_per_engine,
                             seed=cfg.seed, dtype=cfg.model.dtype, output_dir=output_dir, colocate=c.colocate,
                             offload=offload, device=pick_device(c.device).type)
    from slime_hydra.rollout.local import LocalRollout

    return LocalRollout(model, tokenizer, seed=cfg.seed, generation_batch_size=cfg.rollout.generation_batch_size,
                        model_impl=cfg.model.model_impl)


def build(cfg: RunConfig, output_dir: str, parent_run_id: Optional[str] = None) -> Components:
    if cfg.cluster.num_threads:
        torch.set_num_threads(cfg.cluster.num_threads)
    if cfg.cluster.backend == "ray":  # placement group, train group, rollout manager: the same Components
        from slime_hydra.orchestration.driver import build_ray

        return build_ray(cfg, output_dir, parent_run_id)
    seed_everything(cfg.seed)
    tokenizer = build_tokenizer(cfg.model)
    sampling = rollout_sampling(cfg.rollout, (tokenizer.eos_token_id,))
    train_prompts = load_data(cfg, tokenizer)
    # a train-only replay has no rollout engine to evaluate with
    eval_sets = {} if cfg.load_debug_rollout_data else build_eval_sets(cfg, tokenizer, sampling)
    metadatas = [p.metadata for p in train_prompts] + [p.metadata for es in eval_sets.values() for p in es.prompts]
    if problems := check_sample_overrides(metadatas, "data"):  # per-sample generate hooks, before any model
        raise ConfigError(problems)
    device = pick_device(cfg.cluster.device)
    resume = ckpt.resolve_checkpoint(cfg.load) if cfg.load else None
    state = ckpt.load_state(resume) if resume else None
    check_resume(cfg, resume, state)
    dump = open_replay(cfg, tokenizer, state)  # checked before any model is built
    model_cfg = cfg.model if resume is None or is_rollout_only(state) else type(cfg.model)(**{**cfg.model.__dict__, "hf_checkpoint": str(resume)})
    model = build_model(model_cfg, tokenizer, cfg.seed).to(device)
    trainer = NoTrain() if cfg.debug_rollout_only else build_trainer(cfg, model, device)
    if cfg.debug_rollout_only:
        print("debug_rollout_only: no trainer built (no optimizer, no weight sync; checkpoints hold no weights)", flush=True)
    source = PromptSource(train_prompts, cfg.rollout.n_samples_per_prompt, cfg.rollout.rollout_shuffle, cfg.rollout.rollout_seed)
    tracker = build_tracker(cfg.logger, cfg.experiment_name, output_dir, resume_run_id=(state or {}).get("tracker_run_id"),
                            parent_run_id=parent_run_id)
    if dump is not None:  # train-only replay: the dump's samples, no engine
        rollout, buffer = ReplayRollout(dump), ReplayBuffer(dump, source, state["rollout_id"] + 1 if state else 0)
    else:
        rollout = wrap_rollout(build_rollout(cfg, model, tokenizer, output_dir), tokenizer, cfg.rollout.custom_generate,
                               cfg.rollout.max_turns, metadatas)
        rollout = NoWeightSync(rollout) if cfg.debug_rollout_only else rollout
        buffer = DataBuffer(source, load_target(cfg.rollout.buffer_filter))
    comps = Components(tokenizer, train_prompts, eval_sets, source, trainer, rollout,
                       RewardScorer(cfg.reward), tracker, sampling, output_dir=output_dir, resumed_from=resume,
                       buffer=buffer, rollout_dump_meta=rollout_dump_meta(cfg, tokenizer))
    if state is not None:
        restore(comps, state)
    return comps


def engine_state(c: Components, rollout_id: int) -> dict:
    trainer = None if isinstance(c.trainer, DistCheckpointing) else c.trainer.state_dict()  # megatron: <ckpt>/megatron/
    return {"rollout_id": rollout_id, "trainer": trainer, "rollout": c.rollout.state_dict(),
            "source": c.source.state_dict(), "buffer": c.buffer.state_dict(), "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
            "history": c.history, "tracker_run_id": c.tracker.run_id}


def restore(c: Components, state: dict) -> None:
    if isinstance(c.trainer, DistCheckpointing):
        c.trainer.load_checkpoint(str(c.resumed_from))
    else:
        c.trainer.load_state_dict(state["trainer"])
    c.rollout.load_state_dict(state["rollout"])
    c.source.load_state_dict(state["source"])
    if "buffer" in state:
        c.buffer.load_state_dict(state["buffer"])
    c.ready = {k: state[k] for k in ("async_ready", "async_published_version") if k in state}
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    c.history = list(state["history"])
    c.start_rollout = state["rollout_id"] + 1
