"""`cluster.backend=ray`: the run's components as Ray actors in one placement group (slime's driver).

The order is slime's: data and configs are checked first, then the cluster is joined and the layout
checked against what it holds (a clear error, exit code 2, before any actor or model is built), then
the placement group, the train group and the rollout manager. The result is the same `Components`
the in-process build returns, so `engine/loop.py` runs unchanged on either. A custom generate hook
(multi-turn agents) runs in the driver, over the manager's engines, exactly as it runs over an
in-process engine. Every wait on an actor has the deadline `cluster.ray_call_timeout_s` and names its step,
the key and the checkpoint to resume from (orchestration/calls.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from slime_hydra.agent.hook import check_sample_overrides, wrap_rollout
from slime_hydra.config.plugins import load_target
from slime_hydra.config.schema import RunConfig
from slime_hydra.data.buffer import DataBuffer
from slime_hydra.engine import checkpoint as ckpt
from slime_hydra.engine.build import Components, build_eval_sets, load_data, restore, seed_everything
from slime_hydra.engine.checkpoint import resume_hint
from slime_hydra.engine.steps import rollout_sampling
from slime_hydra.errors import ConfigError
from slime_hydra.models.build import build_tokenizer
from slime_hydra.rewards.compute import RewardScorer
from slime_hydra.tracking.base import build_tracker


def build_ray(cfg: RunConfig, output_dir: str, parent_run_id: Optional[str] = None) -> Components:
    from slime_hydra.orchestration import placement
    from slime_hydra.orchestration.calls import RayCalls
    from slime_hydra.orchestration.rollout_manager import RemoteRollout, RemoteSource, RolloutManager
    from slime_hydra.orchestration.train_group import TrainGroup

    seed_everything(cfg.seed)
    tokenizer = build_tokenizer(cfg.model)
    sampling = rollout_sampling(cfg.rollout, (tokenizer.eos_token_id,))
    train_prompts, eval_sets = load_data(cfg, tokenizer), build_eval_sets(cfg, tokenizer, sampling)
    metadatas = [p.metadata for p in train_prompts] + [p.metadata for es in eval_sets.values() for p in es.prompts]
    if problems := check_sample_overrides(metadatas, "data"):  # per-sample generate hooks, before the cluster
        raise ConfigError(problems)
    resume = ckpt.resolve_checkpoint(cfg.load) if cfg.load else None
    model_cfg = cfg.model if resume is None else type(cfg.model)(**{**cfg.model.__dict__, "hf_checkpoint": str(resume)})
    state = ckpt.load_state(resume) if resume else None

    import ray

    started, where = placement.connect(cfg.cluster)
    pg = None
    try:
        pg, layout = placement.create_placement_group(cfg.cluster, where)
        tracker = build_tracker(cfg.logger, cfg.experiment_name, output_dir, resume_run_id=(state or {}).get("tracker_run_id"),
                                parent_run_id=parent_run_id)
        uri = cfg.logger.tracking_uri if cfg.logger.tracker == "mlflow" else None
        save_dir = cfg.save or str(Path(output_dir) / "checkpoints")  # as engine/session.py decides it
        calls = RayCalls(cfg.cluster.ray_call_timeout_s, lambda: resume_hint(save_dir))
        trainer = TrainGroup(pg, layout, cfg.cluster.num_threads, uri, tracker.run_id if uri else None, calls,
                             cfg.cluster.distributed_timeout_s)
        trainer.setup(model_cfg, cfg.algorithm, cfg.train, cfg.rollout.rollout_temperature,
                      cfg.num_rollout * cfg.train.num_steps_per_rollout, cfg.rollout.rollout_max_response_len, cfg.seed)
        if cfg.rollout.backend == "sglang":  # engines owned by Ray actors, router and client here (sglang_engines.py)
            comps = _sglang_components(cfg, pg, layout, trainer, tokenizer, calls, output_dir, started, train_prompts,
                                       eval_sets, tracker, sampling, resume, metadatas)
            if state is not None:
                restore(comps, state)
            return comps
        manager = ray.remote(RolloutManager).options(num_cpus=0).remote(pg, layout, model_cfg, train_prompts, cfg.rollout, cfg.seed,
                                                                        cfg.cluster.num_threads, cfg.cluster.ray_call_timeout_s)

        def teardown() -> None:
            trainer.shutdown()
            placement.shutdown(pg, started)

        rollout = wrap_rollout(RemoteRollout(manager, calls, on_shutdown=teardown), tokenizer, cfg.rollout.custom_generate,
                               cfg.rollout.max_turns, metadatas)
        source = RemoteSource(manager, calls)
        comps = Components(tokenizer, train_prompts, eval_sets, source, trainer, rollout, RewardScorer(cfg.reward),
                           tracker, sampling, output_dir=output_dir, resumed_from=resume,
                           buffer=DataBuffer(source, load_target(cfg.rollout.buffer_filter)))
    except BaseException:
        placement.shutdown(pg, started)
        raise
    if state is not None:
        restore(comps, state)
    return comps


def _sglang_components(cfg: RunConfig, pg, layout, trainer, tokenizer, calls, output_dir: str, started: bool, train_prompts,
                       eval_sets, tracker, sampling, resume, metadatas) -> Components:
    """rollout.backend=sglang: the SGLangRollout runs here over engine actors; the prompt source is this process's."""
    from slime_hydra.data.source import PromptSource
    from slime_hydra.orchestration import placement
    from slime_hydra.orchestration.sglang_engines import build_sglang_rollout

    def teardown() -> None:
        trainer.shutdown()
        placement.shutdown(pg, started)

    engines = build_sglang_rollout(cfg, pg, layout, trainer, tokenizer, calls, output_dir, teardown)
    rollout = wrap_rollout(engines, tokenizer, cfg.rollout.custom_generate, cfg.rollout.max_turns, metadatas)
    r = cfg.rollout
    source = PromptSource(train_prompts, r.n_samples_per_prompt, r.rollout_shuffle, r.rollout_seed)
    return Components(tokenizer, train_prompts, eval_sets, source, trainer, rollout, RewardScorer(cfg.reward), tracker, sampling,
                      output_dir=output_dir, resumed_from=resume, buffer=DataBuffer(source, load_target(r.buffer_filter)))
