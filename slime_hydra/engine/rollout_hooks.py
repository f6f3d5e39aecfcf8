"""slime's rollout-side hooks as `_target_` nodes: their contracts, their checks before launch, and the calls.

Each key is slime's flag without `--` and `-path`, a node {"_target_": "pkg.mod.fn", **kwargs} whose other keys are
bound as keyword arguments. Where slime passes its whole `args` namespace first, a hook here gets the values it
needs by name instead (`args` is left out of every signature below). The loop and the collector run in the driver
process on either cluster backend, so every hook runs there, in one process or under `cluster.backend=ray` alike.

- `rollout.rollout_function` (slime `--rollout-function-path`) replaces the collector (engine/collect.py: rounds,
  dynamic sampling, abort, partial rollout) wholesale:
      fn(rollout_id: int, data_source: DataBuffer, *, rollout: RolloutBackend, scorer: Scorer,
         sampling: SamplingParams, rollout_batch_size: int, **kwargs) -> list[list[Sample]] | (list[list[Sample]], dict)
  `data_source.get_groups(k)` serves k prompt groups (returned ones first), `data_source.add_groups(groups,
  keep_generation=...)` hands unused ones back; `await rollout.generate(samples, sampling)` generates;
  `await scorer.score_async(samples)` rewards. It returns `rollout_batch_size` groups of equal size (slime:
  RolloutFnTrainOutput.samples; a dict beside them is logged as its metrics); a sample left at reward=None is scored
  with reward.*, and samples a generate hook returned beside one join its group. A sync or an async function. Unlike slime's, it is not called for eval (eval.* decides that), and it
  is handed the engine, the scorer and the sampling instead of reading them from `args`.
- `rollout.rollout_sample_filter` (`--rollout-sample-filter-path`): fn(samples: list[list[Sample]], **kwargs) -> None,
  on the kept groups after the collector (or the rollout function); a sample it marks `remove_sample = True` stays in
  the batch with its loss mask all 0.
- `rollout.rollout_all_samples_process` (`--rollout-all-samples-process-path`): fn(samples: list[list[Sample]],
  data_source: DataBuffer, **kwargs) -> None, after the sample filter, on every group judged in the rollout: the
  kept ones and those dynamic sampling dropped (groups aborted unfinished went back to the buffer and are not here).
- `rollout.custom_convert_samples_to_train_data` (`--custom-convert-samples-to-train-data-path`):
  fn(samples: list[Sample], *, pad_id: int, **kwargs) -> TrainBatch, one row per sample, replacing
  training/batch.collate. Where slime's returns a dict with the rewards too, here the advantage step then writes
  `advantages` from the samples' rewards onto the returned loss mask (reward.* post-processing is its own key).
- `rollout.rollout_data_postprocess` (`--rollout-data-postprocess-path`): fn(rollout_id: int, batch: TrainBatch,
  **kwargs) -> None | TrainBatch, after the advantages and before training: change `batch.loss_mask`,
  `batch.advantages` in place (or return a new batch). slime calls it in the train actor after the log-probs; here
  the trainer computes the old log-probs inside its step, so the batch holds only the rollout's (`rollout_log_probs`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

from slime_hydra.config.plugins import import_target
from slime_hydra.config.schema import RolloutConfig
from slime_hydra.errors import RunError
from slime_hydra.protocols import TrainBatch
from slime_hydra.types import Sample

# key -> (the positional arguments, the keyword arguments the engine passes): what each hook's signature must bind
CALLS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "rollout_function": (("rollout_id", "data_source"), ("rollout", "scorer", "sampling", "rollout_batch_size")),
    "rollout_sample_filter": (("samples",), ()),
    "rollout_all_samples_process": (("samples", "data_source"), ()),
    "custom_convert_samples_to_train_data": (("samples",), ("pad_id",)),
    "rollout_data_postprocess": (("rollout_id", "batch"), ()),
}
# what the collector does that a rollout function replaces: set beside one, these keys would be ignored
COLLECTOR_KEYS = ("dynamic_sampling_filter", "partial_rollout", "over_sampling_batch_size")
DERIVED = {"over_sampling_batch_size": lambda r: r.rollout_batch_size}  # what derivation fills in when it is unset


def check_call(key: str, node: dict, positional: tuple[str, ...], keywords: tuple[str, ...], problems: list[str]) -> None:
    """The node imports and its signature binds fn(<positional>, <keyword>=..., <node's keys>=...)."""
    if not node:
        return
    fn, target = import_target(key, node, problems), node.get("_target_")
    if fn is None:
        return
    kwargs = {k: None for k in node if k != "_target_"}
    try:
        inspect.signature(fn).bind(*[None] * len(positional), **{k: None for k in keywords}, **kwargs)
    except TypeError as e:
        call = ", ".join([*positional, *(f"{k}=..." for k in (*keywords, *kwargs))])
        problems.append(f"{key}._target_={target}: signature {inspect.signature(fn)} does not fit the call fn({call}) ({e})")


def check_rollout_hooks(r: RolloutConfig) -> list[str]:
    """Every rollout hook of the table above imports and binds its call; a rollout function stands alone."""
    problems: list[str] = []
    for name, (positional, keywords) in CALLS.items():
        check_call(f"rollout.{name}", getattr(r, name), positional, keywords, problems)
    if r.rollout_function:
        for k in COLLECTOR_KEYS:
            if getattr(r, k) and getattr(r, k) != DERIVED.get(k, lambda r: None)(r):
                problems.append(f"rollout.{k}={getattr(r, k)} is read by the built-in collector, which "
                                f"rollout.rollout_function replaces; unset rollout.{k} or apply it in the rollout function")
    return problems


async def call_rollout_function(fn: Callable, rollout_id: int, data_source, *, rollout, scorer, sampling,
                                rollout_batch_size: int) -> tuple[list[list[Sample]], dict[str, float]]:
    """The rollout function's groups (unscored samples scored) and its metrics."""
    out = fn(rollout_id, data_source, rollout=rollout, scorer=scorer, sampling=sampling,
             rollout_batch_size=rollout_batch_size)
    if inspect.isawaitable(out):
        out = await out
    groups, metrics = out if isinstance(out, tuple) else (out, {})
    if (not isinstance(groups, list) or len(groups) != rollout_batch_size
            or not all(isinstance(g, list) and g and all(isinstance(s, Sample) for s in g) for g in groups)):
        raise RunError(f"rollout.rollout_function returned {type(groups).__name__} of "
                       f"{len(groups) if isinstance(groups, list) else '?'} item(s) for rollout {rollout_id}; it must "
                       f"return rollout.rollout_batch_size={rollout_batch_size} groups, each a non-empty list[Sample]")
    for g in groups:  # a generate hook's fan-out, as the collector takes it in
        take_siblings(g)
    unscored = [s for g in groups for s in g if s.reward is None]
    if unscored:
        await scorer.score_async(unscored)
    return groups, {f"rollout/{k}" if "/" not in k else k: float(v) for k, v in dict(metrics).items()}


def take_siblings(group: list[Sample]) -> None:
    """The samples a generate hook returned beside each of the group's, put in after it (the group object is kept:
    the buffer and the collector hold it)."""
    if any(s.siblings for s in group):
        group[:] = [x for s in group for x in (s, *s.siblings)]
        for s in group:
            s.siblings = []


def group_size(groups: list[list[Sample]], key: str) -> int:
    """The one size of every group (the advantage step centres rewards per group)."""
    sizes = sorted({len(g) for g in groups})
    if len(sizes) > 1:
        raise RunError(f"{key} gave groups of {sizes} samples in one rollout; the advantage step groups a prompt's "
                       "samples, so every prompt sample must yield the same number of samples (a generate hook: return "
                       "lists of one length)")
    return sizes[0] if sizes else 0


def finish_groups(kept: list[list[Sample]], judged: list[list[Sample]], data_source,
                  sample_filter: Optional[Callable], all_samples_process: Optional[Callable]) -> None:
    """rollout.rollout_sample_filter on the kept groups, then rollout.rollout_all_samples_process on every judged one."""
    if sample_filter is not None:
        sample_filter(kept)
    if all_samples_process is not None:
        all_samples_process(judged, data_source)


def removed_rows(samples: list[Sample]) -> list[int]:
    """The rows rollout.rollout_sample_filter removed from the loss."""
    return [i for i, s in enumerate(samples) if s.remove_sample]


def converted(convert: Callable, samples: list[Sample], pad_id: int) -> TrainBatch:
    batch = convert(samples, pad_id=pad_id)
    if not isinstance(batch, TrainBatch) or batch.num_samples != len(samples):
        raise RunError(f"rollout.custom_convert_samples_to_train_data returned {type(batch).__name__}"
                       f"{f' of {batch.num_samples} rows' if isinstance(batch, TrainBatch) else ''}; it must return a "
                       f"TrainBatch with one row per sample ({len(samples)})")
    return batch


def postprocessed(postprocess: Optional[Callable], rollout_id: int, batch: TrainBatch) -> TrainBatch:
    if postprocess is None:
        return batch
    out: Any = postprocess(rollout_id, batch)
    if out is not None and not isinstance(out, TrainBatch):
        raise RunError(f"rollout.rollout_data_postprocess returned {type(out).__name__}; it must change the batch in "
                       "place and return None, or return a TrainBatch")
    return batch if out is None else out
