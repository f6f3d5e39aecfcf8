"""Serves prompt groups: `n_samples_per_prompt` copies of each prompt, epoch after epoch.

The order is a pure function of (rollout_seed, epoch), so the source's state is three integers
and resuming from a checkpoint continues the same sequence.
"""

from __future__ import annotations

import copy
import random

from slime_hydra.data.dataset import Prompt
from slime_hydra.types import Sample


def prompt_group(p: Prompt, group_index: int, n: int) -> list[Sample]:
    """`n` fresh samples of one prompt, indexed group_index * n + j."""
    return [Sample(prompt=p.prompt, label=p.label, group_index=group_index, index=group_index * n + j,
                   prompt_tokens=list(p.tokens), metadata=copy.deepcopy(p.metadata) if p.metadata else {}) for j in range(n)]


class PromptSource:
    def __init__(self, prompts: list[Prompt], n_samples_per_prompt: int, shuffle: bool, seed: int):
        self.prompts = prompts
        self.n_samples_per_prompt = n_samples_per_prompt
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.offset = 0  # position within the current epoch's order
        self.next_group_index = 0
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_groups(self, num_groups: int) -> list[list[Sample]]:
        groups = []
        for _ in range(num_groups):
            if self.offset == len(self._order):
                self.epoch, self.offset = self.epoch + 1, 0
                self._order = self._epoch_order(self.epoch)
            p = self.prompts[self._order[self.offset]]
            self.offset += 1
            groups.append(prompt_group(p, self.next_group_index, self.n_samples_per_prompt))
            self.next_group_index += 1
        return groups

    def metrics(self) -> dict[str, float]:
        return {}  # rows skipped at load are logged once, at step 0 (app/session.py)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "next_group_index": self.next_group_index}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.offset, self.next_group_index = state["epoch"], state["offset"], state["next_group_index"]
        self._order = self._epoch_order(self.epoch)
