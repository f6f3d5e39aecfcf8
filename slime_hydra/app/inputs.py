"""What both builders (in-process and Ray) do before they part, and how they finish: one copy of each.

Data is loaded before any model is built, so a bad data file fails in a second, not after a model load.
A checkpoint to resume from is resolved and its state read here; each builder restores it once its
Components exist.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from slime_hydra.agent.hook import wrap_rollout
from slime_hydra.app.debug_split import check_resume, is_rollout_only, rollout_dump_meta
from slime_hydra.app.derive import model_context
from slime_hydra.app.plugins import load_hook, load_target, reward_scorer
from slime_hydra.config.checks_hooks import SOURCE_METHODS
from slime_hydra.config.datafiles import eval_datasets, resolve
from slime_hydra.config.schema import ModelConfig, RunConfig
from slime_hydra.data.buffer import DataBuffer
from slime_hydra.data.dataset import Prompt, PromptList, load_prompts
from slime_hydra.data.readers import Prep
from slime_hydra.data.rows import RowKeys
from slime_hydra.data.source import PromptSource as InMemorySource
from slime_hydra.data.stream import read_head, streaming_source
from slime_hydra.engine import checkpoint as ckpt
from slime_hydra.engine.components import Components
from slime_hydra.engine.steps import EvalSet, eval_sampling, rollout_sampling
from slime_hydra.errors import DataError
from slime_hydra.models.build import build_tokenizer
from slime_hydra.protocols import PromptSource, RolloutBackend, Tracker, TrainBackend
from slime_hydra.runtime import seed_everything
from slime_hydra.tracking.base import build_tracker
from slime_hydra.training.specs import AdvantageSpec
from slime_hydra.types import SamplingParams


@dataclass
class Inputs:
    tokenizer: object
    sampling: SamplingParams
    train_prompts: list[Prompt]
    eval_sets: dict[str, EvalSet]
    resume: Optional[Path]  # the checkpoint `load` resolves to
    model: ModelConfig  # cfg.model, pointed at the checkpoint when resuming
    state: Optional[dict]  # its engine state (engine/components.engine_state)


def load_data(cfg: RunConfig, tokenizer) -> list[Prompt]:
    """The training prompts, loaded and checked; none with data.streaming (the source reads them as needed)."""
    d = cfg.data
    if d.streaming:  # the warm start samples from the first data.shuffle_buffer_size prompts
        return read_head(*stream_files(cfg, tokenizer), d.shuffle_buffer_size, d.on_bad_row) if cfg.warmstart.steps \
            else PromptList()
    return load_prompts(d.prompt_data, tokenizer, input_key=d.input_key, label_key=d.label_key,
                        metadata_key=d.metadata_key, apply_chat_template=d.apply_chat_template,
                        max_prompt_len=d.rollout_max_prompt_len, what="data.prompt_data", tool_key=d.tool_key,
                        on_bad_row=d.on_bad_row, generate_hooks=frozenset(cfg.rollout.generate_hooks),
                        max_line_bytes=d.max_line_bytes, template_kwargs=d.apply_chat_template_kwargs)


def stream_files(cfg: RunConfig, tokenizer) -> tuple[list, Prep]:
    d = cfg.data
    files, problems = resolve(d.prompt_data)
    if problems:
        raise DataError("; ".join(problems))
    keys = RowKeys(d.input_key, d.label_key, d.metadata_key, d.tool_key, generate_hooks=frozenset(cfg.rollout.generate_hooks))
    return files, Prep(keys, tokenizer, d.apply_chat_template, d.rollout_max_prompt_len, d.max_line_bytes,
                       dict(d.apply_chat_template_kwargs))


def build_source(cfg: RunConfig, tokenizer, train_prompts: list[Prompt]) -> PromptSource:
    """The prompt source: over the loaded prompts, or (data.streaming) over the files, read as needed."""
    r, d = cfg.rollout, cfg.data
    if d.data_source:  # slime's --data-source-path: the user's source, given the loaded prompts
        return custom_source(d.data_source, train_prompts, tokenizer, r.n_samples_per_prompt, r.rollout_seed)
    if not d.streaming:
        return InMemorySource(train_prompts, r.n_samples_per_prompt, r.rollout_shuffle, r.rollout_seed)
    return streaming_source(*stream_files(cfg, tokenizer), r.n_samples_per_prompt, r.rollout_shuffle, r.rollout_seed,
                            d.shuffle_buffer_size, d.on_bad_row, d.num_workers, d.worker_timeout_s)


def custom_source(node: dict, prompts: list[Prompt], tokenizer, n_samples_per_prompt: int, seed: int) -> PromptSource:
    """data.data_source built; an object without a prompt source's methods (a factory's) is refused by name."""
    source = load_target(node)(prompts, tokenizer, n_samples_per_prompt, seed)
    missing = [m for m in SOURCE_METHODS if not callable(getattr(source, m, None))]
    if missing:
        raise DataError(f"data.data_source._target_={node['_target_']} built a {type(source).__name__} without "
                        f"{', '.join(missing)}: a prompt source has {', '.join(SOURCE_METHODS)} (protocols.PromptSource)")
    return source


def eval_max_prompt_len(cfg: RunConfig, eval_max_response_len: int) -> Optional[int]:
    """An eval set's prompt limit: data.rollout_max_prompt_len, and no more than the model's context leaves beside the
    set's own response length (app/derive.py)."""
    context, _ = model_context(cfg)
    limits = [x for x in (cfg.data.rollout_max_prompt_len, context and context - eval_max_response_len) if x is not None]
    return max(min(limits), 1) if limits else None


def build_eval_sets(cfg: RunConfig, tokenizer, sampling: SamplingParams) -> dict[str, EvalSet]:
    d, sets = cfg.data, {}
    for name, ds in eval_datasets(cfg).items():
        prompts = load_prompts(ds.path, tokenizer, input_key=ds.input_key, label_key=ds.label_key,
                               metadata_key=ds.metadata_key, apply_chat_template=d.apply_chat_template,
                               max_prompt_len=eval_max_prompt_len(cfg, ds.eval_max_response_len),
                               what=f"eval.eval_prompt_data.{name}", max_line_bytes=d.max_line_bytes,
                               tool_key=d.tool_key, on_bad_row=d.on_bad_row, key_prefix=f"eval.eval_prompt_data.{name}",
                               generate_hooks=frozenset(cfg.rollout.generate_hooks),
                               template_kwargs=d.apply_chat_template_kwargs)
        scorer = reward_scorer(dataclasses.replace(cfg.reward, rm_type=ds.rm_type), cfg.eval.eval_reward_key)
        sets[name] = EvalSet(prompts, eval_sampling(ds, sampling), ds.n_samples_per_eval_prompt, scorer)
    return sets


def prepare(cfg: RunConfig) -> Inputs:
    """Seed, tokenizer, data and eval sets (their per-sample hooks checked), and the checkpoint to resume."""
    seed_everything(cfg.seed)
    tokenizer = build_tokenizer(cfg.model)
    sampling = rollout_sampling(cfg.rollout, (tokenizer.eos_token_id,))
    train_prompts = load_data(cfg, tokenizer)
    # a train-only replay has no rollout engine to evaluate with
    eval_sets = {} if cfg.load_debug_rollout_data else build_eval_sets(cfg, tokenizer, sampling)
    resume = ckpt.resolve_checkpoint(cfg.load) if cfg.load else None
    state = ckpt.load_state(resume) if resume else None
    check_resume(cfg, resume, state)  # a rollout-only checkpoint resumes only a rollout-only run
    # a rollout-only checkpoint holds no weights: the run starts from model.hf_checkpoint again
    model = cfg.model if resume is None or is_rollout_only(state) else dataclasses.replace(cfg.model, hf_checkpoint=str(resume))
    return Inputs(tokenizer, sampling, train_prompts, eval_sets, resume, model, state)


def make_tracker(cfg: RunConfig, inputs: Inputs, output_dir: str, parent_run_id: Optional[str]) -> Tracker:
    """A resumed run logs into its own tracker run again."""
    return build_tracker(cfg.logger, cfg.experiment_name, output_dir, resume_run_id=(inputs.state or {}).get("tracker_run_id"),
                         parent_run_id=parent_run_id)


def assemble(cfg: RunConfig, inputs: Inputs, source, trainer: TrainBackend, rollout: RolloutBackend, tracker: Tracker,
             advantage: AdvantageSpec, output_dir: str, buffer: Optional[DataBuffer] = None) -> Components:
    """The loop's Components. A generating rollout backend is wrapped by the generate hook (rollout.custom_generate),
    if any; a replay (`buffer` given: the dump's samples) generates nothing and is not."""
    if buffer is None:
        rollout = wrap_rollout(rollout, inputs.tokenizer, cfg.rollout.custom_generate, cfg.rollout.max_turns, load_hook,
                               cfg.rollout.generate_hooks)
        buffer = DataBuffer(source, load_target(cfg.rollout.buffer_filter))
    return Components(inputs.tokenizer, inputs.train_prompts, inputs.eval_sets, source, trainer, rollout,
                      reward_scorer(cfg.reward), tracker, inputs.sampling, advantage, output_dir=output_dir,
                      resumed_from=inputs.resume, buffer=buffer,
                      rollout_dump_meta=rollout_dump_meta(cfg, inputs.tokenizer),
                      eval_function=load_target(cfg.eval.eval_function),
                      rollout_log=load_target(cfg.logger.custom_rollout_log_function),
                      eval_log=load_target(cfg.logger.custom_eval_rollout_log_function))
