"""Core value types shared by rollout, reward and training: Sample and SamplingParams."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Optional


class Status(str, enum.Enum):
    PENDING = "pending"
    COMPLETED = "completed"  # ended on a stop token
    TRUNCATED = "truncated"  # hit rollout_max_response_len
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class Sample:
    """One prompt and one response, in the spirit of slime's Sample."""

    prompt: Any  # str, or a chat list of {"role", "content"}
    label: Optional[str] = None
    group_index: Optional[int] = None  # which prompt group this sample belongs to
    index: Optional[int] = None  # unique sample index within the run
    prompt_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # prompt + response token ids
    response: str = ""
    response_length: int = 0
    reward: Optional[float] = None
    loss_mask: Optional[list[int]] = None  # one entry per response token; 1 = trains
    rollout_log_probs: Optional[list[float]] = None  # one per response token
    status: Status = Status.PENDING
    weight_version: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    remove_sample: bool = False  # set by rollout.rollout_sample_filter: the sample stays in the batch, its loss mask all 0
    # the other samples a generate hook returned for this one (a list[Sample]); the collector puts them into the group
    # right after it, each trained with its own loss_mask, and empties this list
    siblings: list["Sample"] = field(default_factory=list)

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[len(self.tokens) - self.response_length :]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off; 1: greedy
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
