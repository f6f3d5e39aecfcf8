"""The data buffer: groups served back before fresh prompts, and the built-in filters.

A group is the `n_samples_per_prompt` samples of one prompt. Groups come back to the buffer when a
rollout ends with them unused: aborted mid-generation (with `rollout.partial_rollout` they keep what
they generated so far and continue later; without it they are reset to fresh prompts), or finished
but surplus to `rollout_batch_size` under over-sampling. The next rollout serves them first (which
ones, `rollout.buffer_filter` decides; first-in first-out by default), then fresh groups from the
prompt source. Unlike slime, which checkpoints only the source position, the buffer's contents are
saved too, so a resumed run neither loses nor repeats a prompt.

Plug-in contracts (both `_target_` nodes, bound against these signatures at validation time):
- buffer_filter(buffer: list[list[Sample]], num_groups: int, **kwargs) -> list[list[Sample]]:
  at most `num_groups` distinct groups taken from `buffer` (the same objects); they are removed from
  the buffer and served in the order returned.
- dynamic_sampling_filter(group: list[Sample], **kwargs) -> bool | tuple[bool, str]: called on each
  finished, scored group; False drops it (reason: the function's name), (False, reason) drops it
  with that reason, which names the `rollout/dynamic_sampling_dropped_<reason>` metric.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from slime_hydra.data.source import PromptSource
from slime_hydra.errors import UserError
from slime_hydra.types import Sample, Status

Group = list[Sample]
DONE = (Status.COMPLETED, Status.TRUNCATED, Status.FAILED)


def fifo_buffer_filter(buffer: list[Group], num_groups: int) -> list[Group]:
    """The default: the oldest groups first."""
    return buffer[:num_groups]


def check_reward_nonzero_std(group: Group) -> bool | tuple[bool, str]:
    """DAPO's dynamic sampling: a group whose rewards all agree has zero advantage everywhere; drop it."""
    rewards = [s.reward for s in group]
    if all(r == rewards[0] for r in rewards):
        return False, "zero_std"
    return True


def is_done(s: Sample) -> bool:
    return s.status in DONE


def reset_sample(s: Sample) -> None:
    """Back to a fresh prompt: what it generated is discarded."""
    s.tokens, s.response, s.response_length, s.reward = [], "", 0, None
    s.loss_mask = s.rollout_log_probs = None
    s.status, s.weight_version = Status.PENDING, 0
    s.remove_sample, s.siblings = False, []
    s.metadata.pop("reward_dict", None)


class DataBuffer:
    def __init__(self, source: PromptSource, buffer_filter: Optional[Callable] = None, key: str = "rollout.buffer_filter"):
        self.source = source
        self.buffer_filter = buffer_filter or fifo_buffer_filter
        self.key = key  # named in contract errors
        self.groups: list[Group] = []

    def get_groups(self, num_groups: int) -> list[Group]:
        """`num_groups` groups: from the buffer first (as buffer_filter picks), then fresh ones."""
        served = self._take(num_groups) if self.groups else []
        return served + self.source.next_groups(num_groups - len(served))

    def _take(self, num_groups: int) -> list[Group]:
        picked = self.buffer_filter(list(self.groups), num_groups)
        ids = [id(g) for g in picked]
        held = {id(g) for g in self.groups}
        if not isinstance(picked, list) or len(picked) > num_groups or len(set(ids)) != len(ids) or not set(ids) <= held:
            raise UserError(f"{self.key} returned {type(picked).__name__} of {len(picked) if isinstance(picked, list) else '?'} "
                            f"item(s); it must return a list of at most num_groups={num_groups} distinct groups taken from "
                            "the buffer it was given")
        chosen = set(ids)
        self.groups = [g for g in self.groups if id(g) not in chosen]
        return picked

    def add_groups(self, groups: list[Group], keep_generation: bool) -> None:
        """Return unused groups; `keep_generation=False` resets them to fresh prompts."""
        for g in groups:
            if not keep_generation:
                for s in g:
                    reset_sample(s)
            self.groups.append(g)

    def __len__(self) -> int:
        return len(self.groups)

    def state_dict(self) -> dict:
        return {"groups": [[sample_to_dict(s) for s in g] for g in self.groups], "source": self.source.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.groups = [[sample_from_dict(d) for d in g] for g in state["groups"]]
        self.source.load_state_dict(state["source"])


def sample_to_dict(s: Sample) -> dict:
    d = dataclasses.asdict(s)
    d["status"] = s.status.value
    return d


def sample_from_dict(d: dict) -> Sample:
    return Sample(**{**d, "status": Status(d["status"]), "siblings": [sample_from_dict(x) for x in d.get("siblings", [])]})
