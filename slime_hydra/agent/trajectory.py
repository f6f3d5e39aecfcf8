"""Token bookkeeping of a multi-turn sample: token-in, token-out.

The sample's tokens are the prompt followed by every model turn and observation, each appended as
the exact ids the model produced or was fed; text is decoded only for parsing and logging, never
re-encoded. Model tokens train (loss_mask 1, their rollout log-prob kept for importance ratios);
observation tokens do not (loss_mask 0, log-prob 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from slime_hydra.types import Sample, Status


@dataclass
class Trajectory:
    prompt_tokens: list[int]
    response: list[int] = field(default_factory=list)  # model and observation tokens, in order
    loss_mask: list[int] = field(default_factory=list)  # [len(response)]
    log_probs: list[float] = field(default_factory=list)  # [len(response)]
    model_turns: list[list[int]] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt_tokens + self.response

    def add_model(self, tokens: list[int], log_probs: list[float]) -> None:
        assert len(tokens) == len(log_probs), (len(tokens), len(log_probs))
        self.response += tokens
        self.loss_mask += [1] * len(tokens)
        self.log_probs += [float(x) for x in log_probs]
        self.model_turns.append(list(tokens))

    def add_observation(self, tokens: list[int]) -> None:
        self.response += tokens
        self.loss_mask += [0] * len(tokens)
        self.log_probs += [0.0] * len(tokens)

    def finish(self, sample: Sample, tokenizer, status: Status, weight_version: int) -> Sample:
        """Fill the sample; `response` keeps the markers (special tokens) so a reward sees the whole trajectory."""
        sample.tokens = self.tokens
        sample.response_length = len(self.response)
        sample.loss_mask = list(self.loss_mask)
        sample.rollout_log_probs = list(self.log_probs)
        sample.response = strip_eos(tokenizer.decode(self.response), tokenizer)
        sample.metadata["model_turns"] = [strip_eos(tokenizer.decode(t, skip_special_tokens=True), tokenizer)
                                          for t in self.model_turns]
        sample.status = status
        sample.weight_version = weight_version
        return sample


def strip_eos(text: str, tokenizer) -> str:
    for tok in (tokenizer.eos_token, tokenizer.pad_token):
        if tok:
            text = text.replace(tok, "")
    return text
